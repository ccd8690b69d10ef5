"""Runs INSIDE a task image (not imported by air): writes a dataset into the layout `datasets.load_dataset(ID)`
resolves with no network, the `datasets` cache of a dataset loaded once by its hub id.

    python hf_store_convert.py SRC OUT HUB_ID

SRC is a `save_to_disk` folder (a Dataset or a DatasetDict) or any folder `load_dataset(SRC)` reads (a hub snapshot
of parquet/arrow/csv/json files). OUT receives `<ns>___<name>/default/0.0.0/<hash>/` holding `dataset_info.json`
(features and splits) and one Arrow stream file per split, `<name>-<split>.arrow`. With HF_DATASETS_OFFLINE=1 and
HF_DATASETS_CACHE=OUT, `load_dataset(HUB_ID)` finds it through `datasets`' own cache lookup (the packaged `cache`
builder), which only reads: OUT can be mounted read-only. It runs with the image's own `datasets`, so the layout
is the one the tasks' `datasets` reads. Prints one JSON line: splits and rows.
"""

import hashlib
import json
import os
import sys

import datasets
import pyarrow as pa


def _load(src):
    if os.path.exists(os.path.join(src, "dataset_dict.json")) or os.path.exists(os.path.join(src, "state.json")):
        ds = datasets.load_from_disk(src)
    else:
        ds = datasets.load_dataset(src)
    return datasets.DatasetDict({"train": ds}) if isinstance(ds, datasets.Dataset) else ds


def main(src, out, hub_id):
    ds = _load(src)
    parts = hub_id.split("/")
    # datasets names the cache folder and files after the hub id exactly so (packaged_modules/cache).
    name = datasets.naming.camelcase_to_snakecase(parts[-1])
    folder_name = "___".join(parts[:-1] + [name])
    digest = hashlib.sha256(json.dumps({k: v._fingerprint for k, v in ds.items()}, sort_keys=True).encode())
    target = os.path.join(out, folder_name, "default", "0.0.0", digest.hexdigest()[:16])
    os.makedirs(target)
    splits = datasets.SplitDict(dataset_name=name)
    for split, dset in ds.items():
        table = dset.flatten_indices().data.table if dset._indices is not None else dset.data.table
        path = os.path.join(target, f"{name}-{split}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        splits.add(datasets.SplitInfo(name=split, num_examples=table.num_rows, num_bytes=os.path.getsize(path),
                                      dataset_name=name))
    first = next(iter(ds.values()))
    info = datasets.DatasetInfo(description=first.info.description, features=first.features,
                                config_name="default", dataset_name=name, splits=splits, version="0.0.0")
    info.write_to_directory(target)
    print(json.dumps({"splits": {s: v.num_examples for s, v in splits.items()},
                      "datasets": datasets.__version__}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
