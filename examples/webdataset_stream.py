"""WebDataset tar shards from S3 with a seeded augmentation: kill -9 mid-epoch at 2 workers, resume at 0, prove it equal.

Draws 320 small PNG images of 4 classes with PIL and writes them as webdataset shards (``00042.png`` +
``00042.cls`` members, 8 ``.tar`` files of 40 records), uploads them to an S3 server on 127.0.0.1 (moto,
started here unless ``--s3`` names one), and trains a tiny CNN on them through ``ShardedStream`` +
``TarReader`` behind one node-local ``ShardCache``. The transform decodes the PNG and augments it (a random
crop and flip) from the record's own seeded generator (``SeededTransform``), so a record draws the same
augmentation whichever worker delivers it, before or after a resume.

A run with 2 DataLoader workers is killed with SIGKILL mid-epoch and resumed from its last checkpoint with
0 workers; it is compared with a run never interrupted: the record ids of every batch, a hash of every
augmented batch and the final weights, bit for bit. (About 25 s on 2 cores.)

    python examples/webdataset_stream.py                             # starts moto on 127.0.0.1
    python examples/webdataset_stream.py --s3 http://127.0.0.1:5000  # e.g. `moto_server -p 5000`
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from stateful_sampler import SampleRNG
from stateful_sampler.stream import SeededTransform, ShardCache, ShardedStream, TarReader

RECORDS, SHARDS, CLASSES, SIZE, CROP = 320, 8, 4, 20, 16
WINDOW, BATCH, EPOCHS, SAVE_EVERY, SEED = 4, 16, 2, 5, 11
STEPS_PER_EPOCH = RECORDS // BATCH  # 20
KILL_AFTER = 28  # epoch 1, batch 8 of 20: the last checkpoint is step 25
CREDENTIALS = {"key": "testing", "secret": "testing"}


# -- the data: PNGs of 4 classes (a bright quadrant) in webdataset tar shards


def draw(index: int) -> tuple[bytes, int]:
    """One 20x20 RGB PNG: noise with a bright quadrant, the quadrant being the class."""
    rng = np.random.default_rng(index)
    label = int(rng.integers(CLASSES))
    pixels = rng.integers(0, 96, size=(SIZE, SIZE, 3), dtype=np.uint8)
    half = SIZE // 2
    row, col = divmod(label, 2)
    pixels[row * half : (row + 1) * half, col * half : (col + 1) * half, label % 3] += 150
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue(), label


def write_shards(root: Path) -> list[Path]:
    """``train-0000.tar`` .. : each record ``{key}.png`` and ``{key}.cls``, as webdataset's ``TarWriter`` writes them."""
    paths = []
    for shard, ids in enumerate(np.array_split(np.arange(RECORDS), SHARDS)):
        path = root / f"train-{shard:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for index in ids.tolist():
                png, label = draw(index)
                for suffix, data in (("png", png), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{index:05d}.{suffix}")
                    info.size, info.mtime = len(data), 0
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


# -- a local S3 server (moto), loopback only


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def local_s3(timeout: float = 60.0) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 in its own process; yields its endpoint, stops it after."""
    endpoint = f"http://127.0.0.1:{(port := free_port())}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    with tempfile.TemporaryFile() as log:  # not a pipe: moto logs every request, a full pipe would stall it
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=log, stderr=subprocess.STDOUT, env=env)  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            while True:
                if server.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"moto server exited with {server.returncode}: {log.read().decode()[-2000:]}")
                try:
                    urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"moto server on {endpoint} did not answer in {timeout} s") from None
                    time.sleep(0.1)
            yield endpoint
        finally:
            server.terminate()
            server.wait(timeout=10)


def upload(paths: list[Path], endpoint: str) -> list[str]:
    """The shards on the S3 server, as ``s3://images/...`` URLs."""
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, **CREDENTIALS)
    fs.mkdir("images")
    for path in paths:
        fs.put(str(path), f"images/{path.name}")
    return [f"s3://images/{path.name}" for path in paths]


# -- decoding and augmentation: the transform, seeded per record


def decode(record: dict, rng: SampleRNG) -> tuple[torch.Tensor, int, int]:
    """PNG bytes -> a 3x16x16 float tensor, randomly cropped and flipped from the record's own generator."""
    pixels = np.asarray(Image.open(io.BytesIO(record["png"])).convert("RGB"))
    top, left = rng.numpy.integers(0, SIZE - CROP + 1, size=2)
    pixels = pixels[top : top + CROP, left : left + CROP]
    if rng.numpy.random() < 0.5:
        pixels = pixels[:, ::-1]
    image = torch.from_numpy(pixels.transpose(2, 0, 1).copy()).float() / 255
    return image, int(record["cls"]), int(record["__key__"])


def train(root: Path, run: str, workers: int, stop_after: int | None) -> None:
    """One training process; with ``stop_after`` it blocks after that step, waiting for SIGKILL."""
    source = json.loads((root / "source.json").read_text())
    tar = TarReader(storage_options=source["storage_options"], index_dir=root / "tar-index")  # not ~/.cache
    reader = ShardCache(tar, root / "cache", max_bytes=64 << 20)
    stream = ShardedStream(source["shards"], reader, batch_size=BATCH, window=WINDOW, seed=SEED,
                           transform=SeededTransform(decode))  # fmt: skip
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 7 * 7, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    checkpoint, log = root / f"{run}.pt", root / f"{run}.log"
    step = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        stream.load_state_dict(saved["stream"])
        step = saved["step"]
    loader = stream.loader(num_workers=workers)
    with log.open("a") as out:
        for epoch in range(stream.epoch, EPOCHS):
            stream.set_epoch(epoch)  # a new epoch starts at 0; the restored one keeps its position
            for consumed, (images, labels, ids) in enumerate(loader, 1):
                loss = nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                entry = {"step": step, "epoch": epoch, "workers": workers, "ids": ids.tolist(),
                         "images": hashlib.sha256(images.numpy().tobytes()).hexdigest(), "loss": loss.item()}  # fmt: skip
                print(json.dumps(entry), file=out, flush=True)
                if step % SAVE_EVERY == 0:
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "stream": stream.state_dict(consumed_batches=consumed), "step": step}  # fmt: skip
                    torch.save(state, checkpoint)
                if step == stop_after:
                    print("ready to be killed", flush=True)
                    signal.pause()  # the parent kills this process, and its workers, with SIGKILL
    torch.save(model.state_dict(), root / f"{run}.weights")


def start(root: Path, run: str, workers: int, stop_after: int | None = None) -> subprocess.Popen:
    args = [sys.executable, __file__, "--train", str(root), run, str(workers)] + (
        [str(stop_after)] if stop_after else []
    )
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True)


def steps(root: Path, run: str) -> dict[int, dict]:
    return {entry["step"]: entry for entry in map(json.loads, (root / f"{run}.log").read_text().splitlines())}


def kill_and_resume(root: Path) -> None:
    victim = start(root, "killed", workers=2, stop_after=KILL_AFTER)
    assert victim.stdout is not None
    if victim.stdout.readline().strip() != "ready to be killed":
        raise RuntimeError(f"the training process ended before step {KILL_AFTER}: exit code {victim.wait()}")
    os.killpg(victim.pid, signal.SIGKILL)  # the trainer and its 2 DataLoader workers, no clean-up
    victim.wait()
    saved = torch.load(root / "killed.pt")["step"]
    print(
        f"killed with SIGKILL after step {KILL_AFTER} (epoch 1, batch {KILL_AFTER - STEPS_PER_EPOCH} of "
        f"{STEPS_PER_EPOCH}, 2 workers); resuming from the checkpoint at step {saved} with 0 workers"
    )
    if start(root, "killed", workers=0).wait() != 0:
        raise RuntimeError("the resumed run failed")


def compare(root: Path) -> bool:
    """The killed run's steps up to its checkpoint, then the resumed ones, against the reference."""
    reference, merged = steps(root, "reference"), steps(root, "killed")  # resumed lines overwrite replayed steps
    resumed = sum(entry["workers"] == 0 for entry in merged.values())

    def first_divergence(field: str) -> int | None:
        return next((s for s in reference if merged.get(s, {}).get(field) != reference[s][field]), None)

    ids, images = first_divergence("ids"), first_divergence("images")
    weights = torch.load(root / "reference.weights"), torch.load(root / "killed.weights")
    same_weights = all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    print(f"steps compared:          {len(reference)} ({EPOCHS} epochs of {STEPS_PER_EPOCH} batches), "
          f"{resumed} of them after the resume")  # fmt: skip
    for name, divergence in (("batches: ", ids), ("images:  ", images)):
        if divergence is None:
            print(f"identical {name}      {len(reference)} of {len(reference)}")
        else:
            print(f"first divergence:        {name.strip(': ')}, at step {divergence}")
    print(f"identical final weights: {'yes, bitwise' if same_weights else 'NO'}")
    equal = ids is None and images is None and same_weights and len(merged) == len(reference)
    print(f"verdict:                 {'IDENTICAL' if equal else 'DIFFERENT'}")
    return equal


def run(root: Path, endpoint: str) -> bool:
    paths = write_shards(root)
    shards = upload(paths, endpoint)
    options = {"endpoint_url": endpoint, **CREDENTIALS}
    (root / "source.json").write_text(json.dumps({"shards": shards, "storage_options": options}))
    size = sum(path.stat().st_size for path in paths)
    print(f"wrote {RECORDS} PNGs of {CLASSES} classes as {SHARDS} webdataset shards ({size} bytes) "
          f"on {endpoint} as s3://images/; window k={WINDOW}, batch {BATCH}")  # fmt: skip
    reference = start(root, "reference", workers=2)
    kill_and_resume(root)
    if reference.wait() != 0:
        raise RuntimeError("the uninterrupted run failed")
    equal = compare(root)
    stats = ShardCache(TarReader(), root / "cache", max_bytes=1).stats()
    # Each shard once for the node: the cache counts a tar from its own copy, which the reads then use.
    print(f"fetched from S3:         {stats.bytes} bytes in {stats.transfers} transfers for {size} bytes of shards, "
          f"2 runs x {EPOCHS} epochs, 3 processes, 4 workers")  # fmt: skip
    return equal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", nargs="+", metavar=("ROOT", "RUN"), help=argparse.SUPPRESS)
    parser.add_argument("--s3", metavar="ENDPOINT", help="an S3-compatible server to use instead of starting moto")
    args = parser.parse_args(argv)
    if args.train:
        root, name, workers, *stop = args.train
        train(Path(root), name, int(workers), int(stop[0]) if stop else None)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # a tiny model: one thread per process is faster
    with tempfile.TemporaryDirectory() as scratch:
        if args.s3:
            equal = run(Path(scratch), args.s3)
        else:
            with local_s3() as endpoint:
                equal = run(Path(scratch), endpoint)
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
