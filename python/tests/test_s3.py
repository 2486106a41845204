"""Object storage as the durable tier from Python, against the local S3-protocol server that
scripts/s3-server.sh starts (moto, credentials and signatures checked); skipped when it is not
installed (scripts/s3-server.sh install)."""

import os
import shutil
import subprocess

import pytest
import torch

import tsnap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "s3-server.sh")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    state = str(tmp_path_factory.mktemp("s3-server"))
    env = dict(os.environ, TSNAP_S3_STATE=state, TSNAP_S3_OWNER_PID=str(os.getpid()))
    started = subprocess.run([SCRIPT, "start"], env=env, capture_output=True, text=True)
    if started.returncode != 0:
        pytest.skip(f"no S3 server: {started.stderr.strip()[-300:]}")
    saved = {}
    for line in started.stdout.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            saved[name] = os.environ.get(name)
            os.environ[name] = value.strip("'\"")
    os.environ["TSNAP_S3_PATH_STYLE"] = "1"
    # The bucket, made with the server's own environment's client (tsnap never creates one).
    subprocess.run([os.path.join(REPO, ".venv-s3", "bin", "python"), "-c",
                    "import boto3, os; boto3.client('s3', endpoint_url=os.environ["
                    "'AWS_ENDPOINT_URL_S3']).create_bucket(Bucket='tsnap-py')"],
                   check=True, env=os.environ.copy())
    yield "s3://tsnap-py"
    subprocess.run([SCRIPT, "stop"], env=env, capture_output=True)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def test_drain_to_the_store_then_resume_from_it_with_the_local_disk_gone(s3, tmp_path):
    model = torch.nn.Linear(512, 256)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 512)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    durable = s3 + "/run"
    with tsnap.Snapshotter(tmp_path / "local", durable_root=durable) as snap:
        hook = tsnap.PeriodicSnapshots(snap, lambda: state, every_steps=1, log=False)
        hook.after_step(1)
        hook.finish()
        snap.drain_wait()
        hook.close()
    shutil.rmtree(tmp_path / "local")  # the local disk is gone
    latest = tsnap.latest(durable)
    assert latest == durable + "/step-00000001"
    assert tsnap.verify(latest) == []
    back = tsnap.load(latest)
    for key, value in model.state_dict().items():
        assert torch.equal(back["model"][key], value), key
    # A new run on a new local disk resumes from the store.
    model2 = torch.nn.Linear(512, 256)
    with tsnap.Snapshotter(tmp_path / "local2", durable_root=durable) as snap:
        hook = tsnap.PeriodicSnapshots(snap, lambda: {"model": model2.state_dict()},
                                       every_steps=100, log=False)
        step = hook.resume(lambda st: model2.load_state_dict(st["model"]))
        hook.close()
    assert step == 1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 model2.state_dict().values()))


def test_a_wrong_secret_fails_the_drain_not_the_save(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    state = {"w": torch.randn(1000)}
    with tsnap.Snapshotter(tmp_path, durable_root=s3 + "/creds") as snap:
        snap.save_async("s", state).wait()  # committed locally
        with pytest.raises(tsnap.IoError, match="credentials"):
            snap.drain_wait()
    assert tsnap.latest(tmp_path).endswith("s")
