"""tsnap.transformers: TsnapTrainer's checkpoints as tsnap snapshots, and an exact resume."""

import os
import warnings

import pytest
import torch

pytest.importorskip("transformers")

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
