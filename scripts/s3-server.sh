#!/usr/bin/env bash
# A local S3-protocol server for tsnap's object-storage tests: moto (PyPI `moto[server]`, which
# implements multipart uploads, ranged GETs and ListObjectsV2) in its own virtual environment at
# .venv-s3/ (ignored by git), on 127.0.0.1 only.
#
#   scripts/s3-server.sh install       installs it (idempotent; offline once done)
#   scripts/s3-server.sh start [PORT]  starts a server (a free port when none is given), waits
#                                      until it answers, creates its credentials, then prints
#                                      `export NAME=value` lines for AWS_ENDPOINT_URL_S3,
#                                      AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
#   scripts/s3-server.sh stop          stops it
#
# The server checks credentials and SigV4 signatures like S3: it starts with authentication off,
# creates an IAM user allowed s3:* and an access key for it through its own IAM API, then turns
# authentication on (moto's /moto-api/reset-auth). A wrong key is refused with 403
# InvalidAccessKeyId, a wrong secret with 403 SignatureDoesNotMatch. The credentials are random
# per server and valid for that server only.
#
# State (pid, port, log, the export lines in `env`) lives in $TSNAP_S3_STATE (default
# build/s3-server/), one server per state directory. With TSNAP_S3_OWNER_PID set, the server also
# stops when that process exits (a test program killed before its clean-up).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv-s3"
moto_version="5.2.5"
state="${TSNAP_S3_STATE:-$repo/build/s3-server}"
region="us-east-1"

usage() {
  echo "usage: scripts/s3-server.sh install | start [PORT] | stop" >&2
  exit 2
}

installed() {
  [[ -x "$venv/bin/moto_server" ]] && "$venv/bin/python" - "$moto_version" 2>/dev/null <<'EOF'
import importlib.metadata as m, sys
import boto3, flask  # noqa: F401 (the server and the set-up client)
sys.exit(0 if m.version("moto") == sys.argv[1] else 1)
EOF
}

install() {
  if installed; then
    echo "s3-server: moto $moto_version already in $venv"
    return 0
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "s3-server: creating $venv"
    /usr/bin/python3 -m venv "$venv"
  fi
  echo "s3-server: installing moto[server]==$moto_version into $venv"
  "$venv/bin/pip" install --disable-pip-version-check --no-input -q "moto[server]==$moto_version"
  installed
}

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

start() {
  if ! installed; then
    echo "s3-server: moto is not installed in $venv (run scripts/s3-server.sh install)" >&2
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
    setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$state/server.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$state/pid"
    echo "$port" >"$state/port"
    if "$venv/bin/python" - "$port" "$pid" <<'EOF'; then break; fi
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 60
def running():  # not exited, nor a zombie (exited, not yet reaped by this script)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
while time.monotonic() < deadline:
    if not running():
        sys.exit(1)  # exited (e.g. the port was taken): try another
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=2).read()
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(1)
EOF
    kill "$pid" 2>/dev/null || true
    pid=""
  done
  if [[ -z "$pid" ]]; then
    echo "s3-server: moto_server did not start; its log, $state/server.log:" >&2
    tail -n 20 "$state/server.log" >&2 || true
    exit 1
  fi
  # Credentials through the server's IAM API while authentication is off, then on.
  if ! "$venv/bin/python" - "$port" "$region" >"$state/env.tmp" <<'EOF'; then
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
    kill "$pid" 2>/dev/null || true
    echo "s3-server: could not create the server's credentials" >&2
    exit 1
  fi
  mv "$state/env.tmp" "$state/env"
  if [[ -n "${TSNAP_S3_OWNER_PID:-}" ]]; then
    local owner="$TSNAP_S3_OWNER_PID"
    (
      while alive "$owner" && alive "$pid"; do sleep 1; done
      kill "$pid" 2>/dev/null || true
    ) >/dev/null 2>&1 </dev/null &
    disown
  fi
  cat "$state/env"
}

stop() {
  local pid
  pid="$(running_pid)"
  if [[ -n "$pid" ]]; then
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      alive "$pid" || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$state/pid" "$state/port" "$state/env" "$state/env.tmp"
}

case "${1:-}" in
  install) install ;;
  start) start "${2:-}" ;;
  stop) stop ;;
  *) usage ;;
esac
