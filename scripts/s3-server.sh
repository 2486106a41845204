#!/usr/bin/env bash
# A local S3-protocol server for tsnap's object-storage tests, on 127.0.0.1 only. Two independent
# implementations, chosen by TSNAP_S3_SERVER, so that what one emulator gets wrong does not pass
# unseen:
#   moto        (default) moto (PyPI `moto[server]`: multipart uploads, ranged GETs,
#               ListObjectsV2) in its own virtual environment at .venv-s3/;
#   localstack  LocalStack's own S3 provider (PyPI `localstack-core`, the versions pinned in
#               scripts/localstack-requirements.txt), run from Python without Docker, in
#               .venv-localstack/ on Python 3.13 (which it needs: found on PATH, in pyenv, or
#               installed from Debian's packages where they have it).
# Both virtual environments are ignored by git.
#
#   scripts/s3-server.sh install       installs the chosen server (idempotent; offline once done)
#   scripts/s3-server.sh start [PORT]  starts a server (a free port when none is given), waits
#                                      until it answers, creates its credentials, then prints
#                                      `export NAME=value` lines for AWS_ENDPOINT_URL_S3,
#                                      AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
#                                      TSNAP_S3_SERVER (which server it is)
#   scripts/s3-server.sh stop          stops it
#
# moto checks credentials and SigV4 signatures like S3: it starts with authentication off,
# creates an IAM user allowed s3:* and an access key for it through its own IAM API, then turns
# authentication on (moto's /moto-api/reset-auth). A wrong key is refused with 403
# InvalidAccessKeyId, a wrong secret with 403 SignatureDoesNotMatch. The credentials are random
# per server and valid for that server only.
#
# LocalStack's free S3 provider accepts any credentials and does not check signatures (only
# presigned URLs); it gets access key `test` (its default account) and a random secret.
#
# State (pid, port, log, the export lines in `env`, LocalStack's files) lives in $TSNAP_S3_STATE
# (default build/s3-server/), one server per state directory. With TSNAP_S3_OWNER_PID set, the
# server also stops when that process exits (a test program killed before its clean-up).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
server="${TSNAP_S3_SERVER:-moto}"
state="${TSNAP_S3_STATE:-$repo/build/s3-server}"
region="us-east-1"

moto_version="5.2.5"
localstack_requirements="$repo/scripts/localstack-requirements.txt"

case "$server" in
  moto) venv="$repo/.venv-s3" ;;
  localstack) venv="$repo/.venv-localstack" ;;
  *)
    echo "s3-server: TSNAP_S3_SERVER must be moto or localstack, not '$server'" >&2
    exit 2
    ;;
esac

usage() {
  echo "usage: [TSNAP_S3_SERVER=moto|localstack] scripts/s3-server.sh install | start [PORT] | stop" >&2
  exit 2
}

# --- moto ---------------------------------------------------------------------------------------

moto_installed() {
  [[ -x "$venv/bin/moto_server" ]] && "$venv/bin/python" - "$moto_version" 2>/dev/null <<'EOF'
import importlib.metadata as m, sys
import boto3, flask  # noqa: F401 (the server and the set-up client)
sys.exit(0 if m.version("moto") == sys.argv[1] else 1)
EOF
}

moto_install() {
  if moto_installed; then
    echo "s3-server: moto $moto_version already in $venv"
    return 0
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "s3-server: creating $venv"
    /usr/bin/python3 -m venv "$venv"
  fi
  echo "s3-server: installing moto[server]==$moto_version into $venv"
  "$venv/bin/pip" install --disable-pip-version-check --no-input -q "moto[server]==$moto_version"
  moto_installed
}

# Starts moto on port $1 in the background (setsid: its own session and process group).
moto_launch() {
  setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$1" >"$state/server.log" 2>&1 </dev/null &
}

# Credentials through the server's IAM API while authentication is off, then on.
moto_credentials() {
  "$venv/bin/python" - "$1" "$region" <<'EOF'
import json, sys, urllib.request
import boto3
port, region = sys.argv[1], sys.argv[2]
endpoint = f"http://127.0.0.1:{port}"
iam = boto3.client("iam", endpoint_url=endpoint, region_name=region,
                   aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
iam.create_user(UserName="tsnap-test")
iam.put_user_policy(UserName="tsnap-test", PolicyName="s3-all", PolicyDocument=json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="tsnap-test")["AccessKey"]
# Not form-encoded: the server reads the count from the raw body.
req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                             headers={"Content-Type": "application/octet-stream"})
urllib.request.urlopen(req, timeout=10).read()
print(f"export AWS_ENDPOINT_URL_S3={endpoint}")
print(f"export AWS_REGION={region}")
print(f"export AWS_ACCESS_KEY_ID={key['AccessKeyId']}")
print(f"export AWS_SECRET_ACCESS_KEY={key['SecretAccessKey']}")
EOF
}

# --- LocalStack ---------------------------------------------------------------------------------

# A Python 3.13 interpreter that can make virtual environments, or nothing.
python313() {
  local candidates=()
  if [[ -n "${TSNAP_LOCALSTACK_PYTHON:-}" ]]; then candidates+=("$TSNAP_LOCALSTACK_PYTHON"); fi
  candidates+=(python3.13 /usr/bin/python3.13 /usr/local/bin/python3.13)
  local home="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
  local pyenv_root="${PYENV_ROOT:-$home/.pyenv}"
  if command -v pyenv >/dev/null 2>&1; then pyenv_root="$(pyenv root)"; fi
  local p
  for p in "$pyenv_root"/versions/3.13*/bin/python3.13; do
    if [[ -x "$p" ]]; then candidates+=("$p"); fi
  done
  for p in "${candidates[@]}"; do
    if "$p" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 13))' \
      >/dev/null 2>&1; then
      command -v "$p"
      return 0
    fi
  done
}

localstack_installed() {
  [[ -x "$venv/bin/python" ]] && cmp -s "$localstack_requirements" "$venv/tsnap-requirements.txt" &&
    "$venv/bin/python" -c 'import localstack.runtime.main, service_identity' 2>/dev/null
}

localstack_install() {
  if localstack_installed; then
    echo "s3-server: localstack-core already in $venv"
    return 0
  fi
  local python
  python="$(python313)"
  if [[ -z "$python" ]] && command -v apt-get >/dev/null 2>&1 && ((EUID == 0)) &&
    [[ -n "$(apt-cache policy python3.13-venv 2>/dev/null | grep 'Candidate: [0-9]' || true)" ]]; then
    echo "s3-server: installing python3.13 and python3.13-venv from Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.13 \
      python3.13-venv
    python="$(python313)"
  fi
  if [[ -z "$python" ]]; then
    echo "s3-server: LocalStack needs Python 3.13 (the version it supports; its code uses 3.12 syntax) and" \
      "none was found: not python3.13 on PATH, not pyenv's, not Debian's python3.13-venv." \
      "Set TSNAP_LOCALSTACK_PYTHON to a Python 3.13 interpreter." >&2
    exit 1
  fi
  if [[ -e "$venv" ]] && ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' \
    2>/dev/null; then
    rm -rf "$venv"  # made by another interpreter that is gone or not 3.13
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "s3-server: creating $venv with $python"
    "$python" -m venv "$venv"
  fi
  echo "s3-server: installing localstack-core (scripts/localstack-requirements.txt) into $venv"
  "$venv/bin/pip" install --disable-pip-version-check --no-input -q -r "$localstack_requirements"
  cp "$localstack_requirements" "$venv/tsnap-requirements.txt"
  localstack_installed
}

# LocalStack's runtime with its gateway listening on GATEWAY_LISTEN's address only: its Twisted
# server passes the port alone and would listen on every interface.
localstack_main='
import os
from twisted.internet import endpoints
host = os.environ["GATEWAY_LISTEN"].rsplit(":", 1)[0]
tcp4 = endpoints.TCP4ServerEndpoint
endpoints.TCP4ServerEndpoint = lambda reactor, port, backlog=50, interface="": tcp4(
    reactor, port, backlog, interface or host)
from localstack.runtime.main import main
main()
'

# Starts LocalStack's S3 provider on port $1 in the background: host mode (no Docker, even when
# this runs in a container), its files (objects included) in the state directory and the
# virtual environment, no DNS server, no analytics, nothing fetched from outside.
localstack_launch() {
  mkdir -p "$state/localstack/tmp" "$venv/home"
  (
    cd "$state/localstack"
    exec env HOME="$venv/home" TMPDIR="$state/localstack/tmp" OVERRIDE_IN_DOCKER=0 \
      FILESYSTEM_ROOT="$state/localstack" \
      SERVICES=s3 EAGER_SERVICE_LOADING=1 GATEWAY_LISTEN="127.0.0.1:$1" \
      LOCALSTACK_HOST="127.0.0.1:$1" DNS_ADDRESS=0 DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 \
      setsid "$venv/bin/python" -c "$localstack_main"
  ) >"$state/server.log" 2>&1 </dev/null &
}

localstack_credentials() {
  local secret
  secret="$("$venv/bin/python" -c 'import secrets; print(secrets.token_hex(20))')"
  echo "export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$1"
  echo "export AWS_REGION=$region"
  echo "export AWS_ACCESS_KEY_ID=test"
  echo "export AWS_SECRET_ACCESS_KEY=$secret"
}

# --- either -------------------------------------------------------------------------------------

installed() { "${server}_installed"; }

# Whether process $1 runs (a zombie, killed but not yet reaped, does not).
alive() {
  kill -0 "$1" 2>/dev/null && [[ "$(ps -o stat= -p "$1" 2>/dev/null)" != Z* ]]
}

# The pid of the running server of this state directory, or nothing.
running_pid() {
  local pid
  pid="$(cat "$state/pid" 2>/dev/null || true)"
  if [[ -n "$pid" ]] && alive "$pid"; then echo "$pid"; fi
}

# Stops server $1 and whatever it started (its process group: setsid made it the leader).
terminate() {
  kill -- "-$1" 2>/dev/null || kill "$1" 2>/dev/null || true
}

start() {
  if ! installed; then
    echo "s3-server: $server is not installed in $venv" \
      "(run TSNAP_S3_SERVER=$server scripts/s3-server.sh install)" >&2
    exit 1
  fi
  if [[ -n "$(running_pid)" && -s "$state/env" ]]; then
    cat "$state/env"
    return 0
  fi
  mkdir -p "$state"
  rm -f "$state/env" "$state/pid" "$state/port"
  local port="${1:-}" tries=1 pid=""
  if [[ -z "$port" ]]; then tries=5; fi
  for ((i = 0; i < tries; i++)); do
    if [[ -z "${1:-}" ]]; then
      port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    fi
    # setsid + redirections: the server outlives this script and holds none of its caller's
    # descriptors (a caller reading our output through a pipe gets EOF when we exit).
    "${server}_launch" "$port"
    pid=$!
    echo "$pid" >"$state/pid"
    echo "$port" >"$state/port"
    if "$venv/bin/python" - "$server" "$port" "$pid" <<'EOF'; then break; fi
import json, sys, time, urllib.request
server, port, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
deadline = time.monotonic() + 120
def running():  # not exited, nor a zombie (exited, not yet reaped by this script)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
def ready():
    if server == "moto":
        urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2).read()
        return True
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_localstack/health", timeout=2) as r:
        return json.load(r)["services"].get("s3") in ("available", "running")
while time.monotonic() < deadline:
    if not running():
        sys.exit(1)  # exited (e.g. the port was taken): try another
    try:
        if ready():
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit(1)
EOF
    terminate "$pid"
    pid=""
  done
  if [[ -z "$pid" ]]; then
    echo "s3-server: $server did not start; its log, $state/server.log:" >&2
    tail -n 20 "$state/server.log" >&2 || true
    exit 1
  fi
  if ! "${server}_credentials" "$port" >"$state/env.tmp"; then
    terminate "$pid"
    echo "s3-server: could not create the server's credentials" >&2
    exit 1
  fi
  echo "export TSNAP_S3_SERVER=$server" >>"$state/env.tmp"
  mv "$state/env.tmp" "$state/env"
  if [[ -n "${TSNAP_S3_OWNER_PID:-}" ]]; then
    local owner="$TSNAP_S3_OWNER_PID"
    (
      while alive "$owner" && alive "$pid"; do sleep 1; done
      terminate "$pid"
    ) >/dev/null 2>&1 </dev/null &
    disown
  fi
  cat "$state/env"
}

stop() {
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    terminate "$pid"
    for ((i = 0; i < 100; i++)); do
      alive "$pid" || break
      sleep 0.1
    done
    kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$state/pid" "$state/port" "$state/env" "$state/env.tmp"
  rm -rf "$state/localstack"
}

case "${1:-}" in
  install) "${server}_install" ;;
  start) start "${2:-}" ;;
  stop) stop ;;
  *) usage ;;
esac
