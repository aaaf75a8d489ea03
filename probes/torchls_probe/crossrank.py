"""Checks across ranks, made by the node's local rank 0 once every rank has left its record.

In: the ranks' records (`done.N.json` in the exchange folder, see distributed.py) and that
folder (the weights each rank saved, for the maximum difference). Out: finding dicts:

- TL909 rank divergence: a root model that should be identical on every rank (wrapped in
  DistributedDataParallel; or one whose tensors the script passes to a collective; or, in a
  script that set up a process group, one that is trained on every rank: data-parallel
  training that forgot the wrapper) holds different weights on two ranks at a step boundary.
  Models that differ in structure between ranks, and sharded ones (FSDP, DTensor), are not
  compared. The first differing tensor, the ranks, the boundary and the largest difference.
- TL910 rank data overlap: in data-parallel training, two ranks got the same samples from a
  loader in one pass (sample fingerprints; a sample repeated within one rank's own batches
  does not count, so a dataset of duplicates is not taken for overlap). Reported at the cause:
  on the DataLoader's construction when it has no DistributedSampler (the loop that read the
  shared samples related), else on the loop; and, for one rank's
  own record, a loader with a shuffling DistributedSampler whose epoch never changed between
  two passes (`set_epoch` never called).
- TL803 confirmed: every rank wrote the same checkpoint file.

Everything here is plain Python over the records, except reading back the weights.
"""

from __future__ import annotations

import os
from typing import Any

from torchls_probe.attribution import Location
from torchls_probe.distributed import finding

EXPECTED = {"ddp", "synced", "trained"}
# Two floating-point results that differ by less than this (relative) are the same value
# computed in another order, not a divergence.
TOLERANCE = 1e-6


def _loc(item: Any, fallback: Location | None = None) -> Location | None:
    if isinstance(item, dict) and isinstance(item.get("filename"), str):
        line = item.get("line")
        if isinstance(line, int):
            column = item.get("column")
            if isinstance(column, int):
                # Reports carry code-point columns; a Location wants byte offsets. The source
                # line's text decides, as in positions.py.
                from torchls_probe.positions import source_line

                text = source_line(item["filename"], line)
                start = len(text[: column - 1].encode("utf-8"))
                end_column = item.get("end_column")
                end = (
                    len(text[: end_column - 1].encode("utf-8"))
                    if isinstance(end_column, int)
                    else None
                )
                return Location(item["filename"], line, start, line, end)
            return Location(item["filename"], line)
    return fallback


def _ranks(records: list[dict[str, Any]]) -> str:
    return ", ".join(str(r["rank"]) for r in records)


def compare(records: list[dict[str, Any]], folder: str) -> list[dict[str, Any]]:
    if len(records) < 2 or not all(r.get("initialized") for r in records):
        return []  # no process group: each rank ran the script on its own, as asked
    records = sorted(records, key=lambda r: r["rank"])
    found = _divergence(records, folder)
    found += _overlap(records)
    found += _same_checkpoint(records)
    return found


# -- TL909 ---------------------------------------------------------------------------------------


def _divergence(records: list[dict[str, Any]], folder: str) -> list[dict[str, Any]]:
    found = []
    first = records[0]
    for model in first.get("models") or []:
        index = model["index"]
        others = [_model(r, index) for r in records[1:]]
        if model["kind"] not in EXPECTED or any(o is None for o in others):
            continue
        if any(o["signature"] != model["signature"] or o["type"] != model["type"] for o in others):
            continue  # built differently per rank: not replicas of one model
        difference = _first_difference(records, index)
        if difference is None:
            continue
        label, name, a, b = difference
        largest = _max_difference(records, folder, index, name, a, b)
        where = _loc(model.get("first_call")) or Location(first.get("file", ""), 1)
        found.append(_tl909(records, model, label, name, a, b, largest, where))
    return found


def _model(record: dict[str, Any], index: int) -> dict[str, Any] | None:
    for model in record.get("models") or []:
        if model["index"] == index:
            return model
    return None


def _digests(record: dict[str, Any], label: str, index: int) -> dict[str, Any] | None:
    for boundary in record.get("boundaries") or []:
        if boundary["label"] == label:
            for model in boundary["models"]:
                if model["index"] == index:
                    return model["digests"]
    return None


def _first_difference(
    records: list[dict[str, Any]], index: int
) -> tuple[str, str, dict[str, Any], dict[str, Any]] | None:
    """(boundary, tensor name, rank record, other rank record) of the earliest difference."""
    for boundary in records[0].get("boundaries") or []:
        label = boundary["label"]
        mine = _digests(records[0], label, index)
        if mine is None:
            continue
        for other in records[1:]:
            theirs = _digests(other, label, index)
            if theirs is None:
                continue
            for name, (digest, total, largest) in mine.items():
                if name not in theirs:
                    continue
                digest_b, total_b, largest_b = theirs[name]
                if digest == digest_b:
                    continue
                scale = max(abs(total), abs(total_b), largest, largest_b, 1.0)
                if abs(total - total_b) <= TOLERANCE * scale and largest == largest_b:
                    continue  # the same values summed in another order
                return label, name, records[0], other
    return None


def _max_difference(
    records: list[dict[str, Any]],
    folder: str,
    index: int,
    name: str,
    a: dict[str, Any],
    b: dict[str, Any],
) -> float | None:
    """The largest absolute difference of tensor `name` between ranks a and b at the end."""
    if not a.get("weights") or not b.get("weights"):
        return None
    import torch

    try:
        key = f"{index}/{name}"
        left = torch.load(os.path.join(folder, a["weights"]), weights_only=True, mmap=True)[key]
        right = torch.load(os.path.join(folder, b["weights"]), weights_only=True, mmap=True)[key]
        if left.shape != right.shape:
            return None
        return float((left.double() - right.double()).abs().max())
    except Exception:  # a rank's file is its own: refuse what does not load as weights
        return None


def _tl909(
    records: list[dict[str, Any]],
    model: dict[str, Any],
    label: str,
    name: str,
    a: dict[str, Any],
    b: dict[str, Any],
    largest: float | None,
    where: Location,
) -> dict[str, Any]:
    when = "already " + label if label.startswith("before") else label
    amount = f" (largest difference {largest:.3g})" if largest is not None else ""
    kind = model["kind"]
    related: list[tuple[Location, str]] = []
    synced = _loc(model.get("synced_at"))
    if kind == "ddp":
        why = (
            f"although {model['type']} is wrapped in DistributedDataParallel: something changes "
            "the weights on some ranks only (an in-place edit outside forward and backward, a "
            "rank-dependent update, ranks stepping a different number of times)"
        )
        if synced is not None:
            related.append((synced, "wrapped in DistributedDataParallel here"))
    elif kind == "synced":
        why = (
            "although the script passes its tensors to a collective: not every parameter or "
            "step is synchronised, or an update happens on some ranks only"
        )
        if synced is not None:
            related.append((synced, "a collective on this model's tensors"))
    else:
        why = (
            f"the script sets up a process group and trains {model['type']} on every rank, but "
            "the model is neither wrapped in DistributedDataParallel nor are its gradients "
            "all-reduced, so each rank trains a copy of its own. Wrap it in "
            "DistributedDataParallel (or broadcast the initial weights and all-reduce the "
            "gradients); if a model per rank is what you want, add `# noqa: TL909` to this line"
        )
    seeds = _seed_difference(records)
    built = _loc(model.get("built"))
    if label.startswith("before") and kind != "ddp":
        # Different before any step: the cause is where the replicas were made, not where
        # they are used. A per-rank seed, else the construction that nothing broadcast after.
        used = where
        if seeds is not None:
            where = seeds[0]
            why += "; the ranks were seeded differently, so they start from different weights"
        elif built is not None:
            where = built
            why += "; each rank builds its own initial weights here and none are broadcast"
        if built is not None and built.key() != where.key():
            related.append((built, f"{model['type']} built here, on every rank"))
        related.append((used, f"{model['type']} first used here"))
    elif seeds is not None:
        related.append(seeds)
    subject = f"{model['type']}.{name}"
    message = f"{subject} differs between ranks {a['rank']} and {b['rank']} {when}{amount}: {why}"
    return finding("TL909", "rank-divergence", "error", where, message, related)


def _seed_difference(records: list[dict[str, Any]]) -> tuple[Location, str] | None:
    firsts = [(r["rank"], r["seeds"][0]) for r in records if r.get("seeds")]
    if len(firsts) < 2 or len({item["seed"] for _, item in firsts}) < 2:
        return None
    where = _loc(firsts[0][1]["where"])
    if where is None:
        return None
    seeded = ", ".join(f"rank {rank} with {item['seed']}" for rank, item in firsts[:4])
    return where, f"seeded per rank here: {seeded}"


# -- TL910 ---------------------------------------------------------------------------------------


def _data_parallel(records: list[dict[str, Any]]) -> bool:
    models = records[0].get("models") or []
    if any(m["kind"] in ("ddp", "synced") for m in models):
        return True
    loaders = [loader for record in records for loader in record.get("loaders") or []]
    return any(p.get("distributed_sampler") for loader in loaders for p in loader["passes"])


def _overlap(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not _data_parallel(records):
        return []  # ranks that train different things may well read the same data
    found = []
    first = records[0]
    for loader in first.get("loaders") or []:
        index = loader["index"]
        for number, mine in enumerate(loader["passes"]):
            hit = None
            for other in records[1:]:
                theirs = _pass(other, index, number)
                if theirs is not None:
                    hit = _shared(mine["batches"], theirs["batches"])
                    if hit is not None:
                        hit = (*hit, other)
                        break
            if hit is None:
                continue
            step, in_step, batch_size, total, compared, other = hit
            where = _loc(mine.get("where")) or Location("", 1)
            related = []
            built = _loc(loader.get("built"))
            if mine.get("distributed_sampler"):
                why = (
                    "although the loader uses a DistributedSampler: is it built with each "
                    "rank's own rank and the world size (or left to read them itself)?"
                )
            else:
                why = (
                    "each rank reads the whole dataset, so the ranks train on duplicated data. "
                    "Give the DataLoader a DistributedSampler (sampler=DistributedSampler("
                    "dataset), shuffle left to the sampler)"
                )
                if built is not None:
                    # The fix is made where the loader is built, not where it is read: the
                    # finding goes there, the pass line that showed it is related.
                    read = _loc(mine.get("where"))
                    if read is not None and read.key() != built.key():
                        related.append((read, "the ranks read the same samples here"))
                    where = built
            message = (
                f"ranks {first['rank']} and {other['rank']} received the same samples: "
                f"{in_step} of the {batch_size} in batch {step + 1} of pass {number + 1} over "
                f"the loader ({total} shared over the {compared} batches compared): {why}"
            )
            found.append(finding("TL910", "rank-data-overlap", "warning", where, message, related))
            break  # one pass is enough to say it
    return found


def _pass(record: dict[str, Any], index: int, number: int) -> dict[str, Any] | None:
    for loader in record.get("loaders") or []:
        if loader["index"] == index and number < len(loader["passes"]):
            return loader["passes"][number]
    return None


def _unique(batches: list[list[int]]) -> set[int]:
    seen: dict[int, int] = {}
    for batch in batches:
        for value in batch:
            seen[value] = seen.get(value, 0) + 1
    return {value for value, count in seen.items() if count == 1}


def _shared(
    mine: list[list[int]], theirs: list[list[int]]
) -> tuple[int, int, int, int, int] | None:
    """(first batch with shared samples, how many there, its size, shared in all, batches)."""
    compared = min(len(mine), len(theirs))
    if compared == 0:
        return None
    left, right = _unique(mine[:compared]), _unique(theirs[:compared])
    common = left & right
    if not common:
        return None
    for step in range(compared):
        in_step = len(set(mine[step]) & set(theirs[step]) & common)
        if in_step:
            return step, in_step, len(mine[step]), len(common), compared
    # Shared, but never in the same step: report the first batch holding one.
    step = next(i for i in range(compared) if set(mine[i]) & common)
    return step, len(set(mine[step]) & common), len(mine[step]), len(common), compared


def repeated_epochs(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A shuffling DistributedSampler that gave two passes the same epoch: no `set_epoch`."""
    found = []
    for loader in record.get("loaders") or []:
        passes = loader["passes"]
        for number in range(1, len(passes)):
            now, before = passes[number], passes[number - 1]
            if not (now.get("distributed_sampler") and now.get("shuffle")):
                continue
            if now.get("epoch") is None or now.get("epoch") != before.get("epoch"):
                continue
            same = bool(now["batches"] and before["batches"]) and (
                now["batches"][0] == before["batches"][0]
            )
            where = _loc(now.get("where")) or Location("", 1)
            evidence = " (its first batch holds the same samples as before)" if same else ""
            message = (
                f"pass {number + 1} over this loader repeats the order of pass {number}"
                f"{evidence}: its DistributedSampler still has epoch {now['epoch']}, because "
                "sampler.set_epoch(epoch) is never called, so every epoch shuffles the same "
                "way on every rank; call it at the start of each epoch"
            )
            found.append(finding("TL910", "rank-data-overlap", "warning", where, message))
            break
    return found


# -- TL803 ---------------------------------------------------------------------------------------


def _same_checkpoint(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    writers: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for record in records:
        for save in record.get("saves") or []:
            writers.setdefault(save["path"], [])
            if all(rank != record["rank"] for rank, _ in writers[save["path"]]):
                writers[save["path"]].append((record["rank"], save))
    found = []
    for path, saved in writers.items():
        if len(saved) < 2:
            continue
        where = _loc(saved[0][1]["where"])
        if where is None:
            continue
        ranks = ", ".join(str(rank) for rank, _ in saved)
        every = "every rank" if len(saved) == len(records) else "several ranks"
        message = (
            f"{every} ({ranks}) wrote {os.path.basename(path)} at run time: the ranks write "
            "one file at once, which can leave it truncated or mixed. Save on rank 0 only "
            "(`if dist.get_rank() == 0:`) and let the others wait at a barrier before loading"
        )
        found.append(finding("TL803", "checkpoint-on-every-rank", "warning", where, message))
    return found
