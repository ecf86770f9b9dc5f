"""maas distill-draft's pieces on a tiny target: packing, the student's start, training."""

import torch

from maas_tools.distill.student import StudentShape, init_student, student_config
from maas_tools.distill.train import TrainConfig, agreement, pack, train

SHAPE = StudentShape(layers=1, hidden_size=16, heads=2, kv_heads=1, intermediate_size=32)


def test_pack_cuts_the_joined_stream_into_overlapping_windows():
    windows = pack([[1, 2, 3], [4, 5, 6, 7]], window=3)
    # Each row is a window's inputs plus the token after it.
    assert windows.tolist() == [[1, 2, 3, 4], [4, 5, 6, 7]]


def test_student_shares_the_vocabulary_and_starts_from_the_targets_embeddings(
    tiny_model, tiny_config
):
    config = student_config(tiny_config, SHAPE)
    student = init_student(tiny_model, config, seed=0)
    assert (config.vocab_size, config.hidden_size, config.num_layers) == (64, 16, 1)
    assert config.eos_token_id == tiny_config.eos_token_id
    # A projection of the target's table: tokens the target embeds alike stay alike.
    target = torch.nn.functional.normalize(tiny_model.model.embed_tokens.weight, dim=-1)
    mine = torch.nn.functional.normalize(student.model.embed_tokens.weight, dim=-1)
    similarity = torch.corrcoef(
        torch.stack([(target @ target.T).flatten(), (mine @ mine.T).flatten()])
    )
    assert similarity[0, 1] > 0.5


def test_training_learns_the_targets_text(tiny_model, tiny_config):
    # What the "target" says: a fixed cycle, so a student that learns it predicts it all.
    cycle = [5, 9, 13, 2, 40, 33, 7, 21]
    sequences = [[3] + cycle * 6 for _ in range(8)]
    student = init_student(tiny_model, student_config(tiny_config, SHAPE), seed=0)
    before = agreement(student, sequences[:2], [9, 9])
    losses = train(
        student,
        pack(sequences, 16),
        TrainConfig(steps=40, batch_size=4, window=16, learning_rate=3e-2, warmup_steps=5),
    )
    assert losses[-1] < losses[0] / 4
    assert agreement(student, sequences[:2], [9, 9]) > max(0.9, before)
