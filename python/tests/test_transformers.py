"""tsnap.transformers: TsnapTrainer's checkpoints as tsnap snapshots, and an exact resume."""

import errno
import os
import signal
import warnings

import pytest
import torch

pytest.importorskip("transformers")

import child_run  # noqa: E402
from child_run import read_losses  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    TrainerCallback,
    TrainingArguments,
)

import tsnap  # noqa: E402
from tsnap.transformers import TsnapTrainer  # noqa: E402

MAX_STEPS = 10  # 32 samples, batches of 4: 8 steps an epoch, so the resume at 6 is mid-epoch


class Recording(TsnapTrainer):
    """Records the loss of every step, as a Python float (bit for bit)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.losses.append(loss.item())
        return loss


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def model(seed):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                      n_head=2, resid_pdrop=0.1, embd_pdrop=0.1,
                                      attn_pdrop=0.1))


def dataset():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (32, 12), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def arguments(output_dir, **kw):
    base = {"output_dir": str(output_dir), "max_steps": MAX_STEPS,
            "per_device_train_batch_size": 4, "learning_rate": 1e-2, "warmup_steps": 2,
            "save_strategy": "steps", "save_steps": 3, "save_total_limit": 2,
            "logging_steps": 1, "report_to": [], "use_cpu": True, "seed": 0,
            "disable_tqdm": True}
    base.update(kw)
    return TrainingArguments(**base)


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def checkpoints(output_dir):
    return sorted(os.listdir(output_dir))


def test_trainer_resumes_bit_identically_with_retention(tmp_path):
    ref = Recording(model=model(0), args=arguments(tmp_path / "ref", save_strategy="no"),
                    train_dataset=dataset())
    ref.train()
    assert len(ref.losses) == MAX_STEPS

    out = tmp_path / "run"
    first = Recording(model=model(0), args=arguments(out), train_dataset=dataset(),
                      callbacks=[StopAt(6)])
    first.train()  # waits for the saves in flight before it returns
    assert first.losses == ref.losses[:6]
    assert checkpoints(out) == ["checkpoint-3", "checkpoint-6"]
    for name in checkpoints(out):
        assert tsnap.verify(out / name) == []
    assert tsnap.metadata(out / "checkpoint-6")["step"] == 6
    assert tsnap.latest(out) == str(out / "checkpoint-6")
    saved = tsnap.load(out / "checkpoint-6")
    assert saved["trainer_state"]["global_step"] == 6
    assert set(saved) == {"model", "optimizer", "scheduler", "rng", "trainer_state"}

    torch.manual_seed(123)  # another state of every generator; the resume restores them
    second = Recording(model=model(1), args=arguments(out), train_dataset=dataset())
    second.train(resume_from_checkpoint=True)
    assert second.state.global_step == MAX_STEPS
    assert first.losses + second.losses == ref.losses  # the loss curve, bit for bit
    for (k, a), b in zip(ref.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(a, b), k
    # save_total_limit=2: checkpoint-9 (and the final one, if the Trainer saved it) kept,
    # checkpoint-3 removed once the newer saves had committed.
    kept = checkpoints(out)
    assert len(kept) == 2 and "checkpoint-3" not in kept and "checkpoint-9" in kept, kept
    second.close_checkpoints()


class BudgetAt(TrainerCallback):
    """Records the run's staging budget at the end of a step."""

    def __init__(self, step):
        self.step, self.budget = step, None

    def on_step_end(self, args, state, control, trainer=None, **kwargs):
        if state.global_step == self.step:
            self.budget = self.trainer._tsnap.snapshotter(args.output_dir).staging_budget


def test_staging_buffers_are_ready_before_the_first_save(tmp_path):
    # Made after the first optimizer step (the optimizer's moments exist by then), so that the
    # first save, at step 3, stalls no longer than the later ones.
    at2 = BudgetAt(2)
    trainer = Recording(model=model(0), args=arguments(tmp_path / "run", max_steps=3),
                        train_dataset=dataset(), callbacks=[at2])
    at2.trainer = trainer
    trainer.train()
    assert at2.budget is not None and at2.budget > 0
    assert checkpoints(tmp_path / "run") == ["checkpoint-3"]
    trainer.close_checkpoints()


def test_unsupported_value_names_its_key(tmp_path):
    class Bad(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            state.trial_params = {"cfg": object()}

    t = TsnapTrainer(model=model(0), args=arguments(tmp_path, max_steps=3),
                     train_dataset=dataset(), callbacks=[Bad()])
    with pytest.raises(tsnap.InvalidArgument, match="'trainer_state/trial_params/cfg'"):
        t.train()
    assert checkpoints(tmp_path) == []


def test_refuses_what_it_does_not_cover(tmp_path):
    t = TsnapTrainer(model=model(0), args=arguments(tmp_path, load_best_model_at_end=True,
                                                   eval_strategy="steps", eval_steps=3),
                     train_dataset=dataset(), eval_dataset=dataset())
    with pytest.raises(tsnap.Error, match="load_best_model_at_end"):
        t.train()
    with pytest.raises(ValueError, match="No valid checkpoint"):
        TsnapTrainer(model=model(0), args=arguments(tmp_path / "e"),
                     train_dataset=dataset()).train(resume_from_checkpoint=True)


# -- a crash mid-run, a full disk ------------------------------------------------------------------

CHILD = r"""
import os, sys, time, warnings
sys.path.insert(0, {tests!r})
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
import test_transformers as T
from transformers import TrainerCallback
from tsnap._integration import is_snapshot

mode, out, losses = sys.argv[1:4]


class Losses(T.Recording):
    def __init__(self, path, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.path = path

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        with open(self.path, "a") as f:
            f.write(f"{{self.state.global_step + 1}} {{self.losses[-1].hex()}}\n")
        return loss


class KillAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        # Step 7: checkpoint-3 committed (waited for), checkpoint-6 maybe still in flight.
        if state.global_step == 7:
            while not is_snapshot(os.path.join(out, "checkpoint-3")):
                time.sleep(0.005)
            os.kill(os.getpid(), 9)


if mode == "kill":
    Losses(losses, model=T.model(0), args=T.arguments(out), train_dataset=T.dataset(),
           callbacks=[KillAt()]).train()
else:
    torch.manual_seed(123)
    Losses(losses, model=T.model(1), args=T.arguments(out),
           train_dataset=T.dataset()).train(resume_from_checkpoint=True)
    Losses(losses + ".ref", model=T.model(0), args=T.arguments(out + "-ref", save_strategy="no"),
           train_dataset=T.dataset()).train()
"""


def run_child(tmp_path, *args):
    return child_run.run_child(tmp_path, CHILD, *args)


def test_kill_9_mid_run_then_resume_bit_identically(tmp_path):
    out, killed, resumed = tmp_path / "run", tmp_path / "killed", tmp_path / "resumed"
    child = run_child(tmp_path, "kill", out, killed)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    # Whatever the kill interrupted, the committed snapshots are whole (a temporary directory
    # may be left: readers skip it and the next writer removes it).
    committed = [n for n in os.listdir(out) if not n.startswith(".")]
    assert "checkpoint-3" in committed and set(committed) <= {"checkpoint-3", "checkpoint-6"}
    for name in committed:
        assert tsnap.verify(out / name) == []
    child = run_child(tmp_path, "resume", out, resumed)
    assert child.returncode == 0, child.stderr[-2000:]
    reference, before, after = (
        read_losses(p) for p in (f"{resumed}.ref", killed, resumed))
    assert len(reference) == MAX_STEPS and len(before) == 7
    assert min(map(int, after)) in (4, 7), sorted(after)
    for step, loss in (before | after).items():
        assert loss == reference[step], (step, loss, reference[step])
    assert max(map(int, after)) == MAX_STEPS
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # the next writer cleaned up


class Grow(TrainerCallback):
    """Gives the model a buffer too big for the disk after the first checkpoint."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == 4:
            model.register_buffer("big", torch.randn(1 << 20))  # 4 MiB on a 2 MiB disk


def test_disk_full_fails_the_save_and_keeps_the_previous(tiny_disk):
    t = TsnapTrainer(model=model(0), args=arguments(tiny_disk, max_steps=7, save_total_limit=1),
                     train_dataset=dataset(), callbacks=[Grow()])
    with pytest.raises(tsnap.IoError, match=r"checkpoint-6 failed \(ENOSPC\)") as failure:
        t.train()  # checkpoint-3's removal waited for checkpoint-6, which failed: kept
    assert failure.value.errno == errno.ENOSPC
    assert checkpoints(tiny_disk) == ["checkpoint-3"]
    assert tsnap.verify(tiny_disk / "checkpoint-3") == []
    assert tsnap.load(tiny_disk / "checkpoint-3")["trainer_state"]["global_step"] == 3
    t.close_checkpoints()
