"""Stand-ins for the reader's own objects that a page's blocks use without defining (a dataset, labels, a model,
a training step, shard files), small so that a page runs in seconds. A prelude runs before the page's first
block, in its namespace and working directory. It defines only what the reader brings: nothing of this
package, and no import a block needs (a block imports what it uses, as a reader copies it)."""

from __future__ import annotations

# The reader's data and model: 3200 records of one feature, a linear model, a step that does nothing.
DATA = """
import numpy as _np
import torch as _torch

dataset = frames = texts = _torch.arange(3200.0).unsqueeze(1)
labels = _np.arange(3200) % 4
sequence_of_frame = sequence_ids = _np.arange(3200) // 10
band = difficulty_band = _np.arange(3200) % 3
token_counts = _np.random.default_rng(0).integers(1, 500, 3200)
tokenised = [_np.arange(count) % 1000 for count in token_counts]
model = _torch.nn.Linear(1, 1)
optimizer = _torch.optim.SGD(model.parameters(), lr=0.01)
epochs, start_epoch, path = 1, 0, "checkpoint.pt"


def train_step(batch):
    model(batch).sum().backward()


def per_sample_loss(outputs):
    return outputs.squeeze(1) ** 2
"""

# Parquet shards of {"x": float, "label": int} records, and the transforms the stream pages name.
SHARDS = """
import pyarrow as _pa
import pyarrow.parquet as _pq

paths = []
for _shard in range(8):
    _path = f"part-{_shard:03d}.parquet"
    _pq.write_table(_pa.table({"x": [float(_shard * 400 + i) for i in range(400)], "label": [_shard] * 400}), _path)
    paths.append(_path)


def to_tensors(record):
    return _torch.tensor([record["x"]])


def augment(record, rng):
    return _torch.tensor([record["x"]]) + 0.1 * _torch.randn(1, generator=rng.torch)


def train_step(batch):
    model(batch).sum().backward()
"""

PRELUDES = {
    "README.md": DATA
    + SHARDS
    + """
a, b, c = list(range(1000)), list(range(1200)), list(range(1000))
concat = a + b + c
""",
    "docs/core.md": DATA + "W, r, B = 2, 0, 32\n",
    "docs/engines.md": DATA + "from pathlib import Path as _Path\n\ncheckpoint = _Path('checkpoint.pt')\n",
    "docs/mixtures.md": DATA
    + """
web, books, code = list(range(1600)), list(range(960)), list(range(640))
""",
    "docs/packing.md": DATA
    + """
dataset = tokenised  # TokenBudgetBatches' records: token sequences
web, code = list(range(2400)), list(range(800))
quality = _np.linspace(0.5, 1.0, 3200)


def pad_collate(records):
    return _torch.nn.utils.rnn.pad_sequence([_torch.as_tensor(record) for record in records], batch_first=True)
""",
    "docs/seeding.md": DATA
    + "\n\ndef save(model, state):\n    _torch.save({'model': model.state_dict(), 'sampler': state}, path)\n",
    "docs/strategies.md": DATA
    + """
_np.save("labels.npy", labels)
_np.save("weights.npy", _np.linspace(0.5, 1.0, 3200))
_np.save("sequence_ids.npy", sequence_ids)
""",
    "docs/streaming.md": DATA + SHARDS,
}
