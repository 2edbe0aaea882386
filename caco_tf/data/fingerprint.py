"""What a data source holds, cheaply enough to check at every start: a comparison pins its
images so that a rerun (or a worker on another machine) that would read other images is refused,
never mixed into one report.

``resolved(spec)`` names a source independently of the working directory (absolute paths);
``fingerprint(spec, ...)`` summarizes what it holds without decoding an image: for files, each
folder's image count, bytes and a hash of their names, sizes and modification times; for the
generated and shipped arrays, a hash of their pixels and labels; for a TFDS set, its name,
version and split sizes.  ``changes(before, after)`` says what differs, in words.
"""

import glob
import hashlib
import os

import numpy as np

# Sources named by a path: (kind, whether the rest is a glob).
PATH_KINDS = {"folder": False, "npz": False, "tfrecord": True, "split": False}


def resolved(spec):
    """``spec`` with its path made absolute (``folder:photos`` → ``folder:/home/me/photos``);
    other sources unchanged."""
    kind, _, rest = spec.partition(":")
    if kind in PATH_KINDS and rest and "://" not in rest:
        return f"{kind}:{os.path.abspath(os.path.expanduser(rest))}"
    return spec


def _files_entry(paths, root):
    """{relative folder: [images, bytes, hash of (name, size, mtime)]} of ``paths``."""
    folders = {}
    for path in sorted(paths):
        status = os.stat(path)
        folder = os.path.relpath(os.path.dirname(path), root)
        count, size, digest = folders.setdefault(folder, [0, 0, hashlib.sha1()])
        digest.update(f"{os.path.basename(path)}\0{status.st_size}\0{status.st_mtime_ns}\n"
                      .encode("utf-8", "surrogateescape"))
        folders[folder] = [count + 1, size + status.st_size, digest]
    return {folder: [count, size, digest.hexdigest()[:16]]
            for folder, (count, size, digest) in folders.items()}


def _arrays_entry(source):
    digest = hashlib.sha1(np.ascontiguousarray(source.images).tobytes())
    if source.labels is not None:
        digest.update(np.ascontiguousarray(source.labels).tobytes())
    return {".": [len(source), int(source.images.nbytes), digest.hexdigest()[:16]]}


def fingerprint(spec, labels_file=None, channels=1, data_dir=None, manual_dir=None):
    """{"source": resolved spec, "folders": {name: [count, bytes, hash]}} of ``spec`` (and of
    the labels file, under its own name)."""
    from caco_tf.data import sources

    spec = resolved(spec)
    kind, _, rest = spec.partition(":")
    if kind == "folder":
        folders = _files_entry(sources.images_under(rest), rest)
    elif kind in PATH_KINDS and "://" not in rest:
        matched = sorted(glob.glob(rest)) if PATH_KINDS[kind] else [rest]
        missing = [path for path in matched if not os.path.isfile(path)]
        if not matched or missing:
            raise sources.DataError(f"{spec}: {missing[0] if missing else rest} is not found "
                                    f"here")
        folders = _files_entry(matched, os.path.dirname(os.path.commonpath(matched)) or "/")
    else:  # generated or shipped arrays, a TFDS set: what loading it gives
        train, held_out = sources.load_source(spec, channels, data_dir, manual_dir)
        folders = {}
        for part, source in (("train", train), ("held-out", held_out)):
            if source is None:
                continue
            if isinstance(source, sources.ArraySource):
                entry = _arrays_entry(source)["."]
            else:
                builder = getattr(source, "builder", None)
                version = str(builder.info.version) if builder is not None else ""
                entry = [len(source), 0, version]
            folders[part] = entry
    if labels_file:
        with open(labels_file, "rb") as handle:
            content = handle.read()
        folders[f"--labels {labels_file}"] = [content.count(b"\n"), len(content),
                                             hashlib.sha1(content).hexdigest()[:16]]
    return {"source": spec, "folders": folders}


def changes(before, after, most=3):
    """What differs between two fingerprints, in words ('' when nothing does)."""
    if before["source"] != after["source"]:
        return f"the source is {after['source']}, not {before['source']}"
    said = []
    old, new = before["folders"], after["folders"]
    for name in sorted(set(old) | set(new)):
        if name not in new:
            said.append(f"{name} is gone ({old[name][0]} images before)")
        elif name not in old:
            said.append(f"{name} is new ({new[name][0]} images)")
        elif old[name][0] != new[name][0]:
            said.append(f"{name} holds {new[name][0]} images, {old[name][0]} before")
        elif old[name] != new[name]:
            said.append(f"{name}'s images changed (their sizes, times or contents)")
    more = f" and {len(said) - most} more" if len(said) > most else ""
    return "; ".join(said[:most]) + more
