"""The run folder: every file a pre-training run reads or writes, named in one place, and what
keeps it usable over a days-long run: one writer at a time, and resume checkpoints that a kill,
a full disk or a truncated file never leave unusable.

    RUN_DIR/
      config.yaml              the resolved configuration
      .lock                    held (an OS lock) by the process writing the folder
      backup/                  resume state: state-<step>.weights.h5 (newest and previous)
                               and training_metadata.json, which points at them
      checkpoints/last.weights.h5   the weights after the last finished epoch
      history.json             one row per finished epoch
      tensorboard/             TensorBoard's event files
      skipped_files.txt        every input file passed over, with the reason
      model.keras              the final model, as ``model.save`` writes it
      saved_model/             the backbone for serving
      results.json             the final figures
      eval_<protocol>....json  what ``caco-evaluate`` measured
      figures/                 ``caco-figures``' plots
      import.json              what ``caco-import-torch`` imported (imported runs only)

A resume checkpoint is written in full under a temporary name, flushed to the disk, renamed,
and only then named in ``training_metadata.json`` (itself replaced atomically) with its size
and CRC-32; the previous checkpoint is kept until a newer one is complete.  At resume a
checkpoint whose size or checksum does not match (truncated by a crash, a disk error) is passed
over for the previous one, with one warning line.
"""

import collections
import datetime
import errno
import json
import logging
import os
import re
import shutil
import socket
import zlib

from caco_tf import __version__
from caco_tf.errors import UserError

log = logging.getLogger("caco_tf")

METADATA = "training_metadata.json"
KEPT = 2  # resume checkpoints kept: the newest and the one before it
# What a run writes before its first step, which the next launch writes again: a run folder
# holding nothing else holds nothing of value (``RunFolder.discard_if_valueless``).
SET_UP_FILES = (".lock", "config.yaml", "skipped_files.txt")


class RunFolderError(UserError):
    """The run folder cannot be used: in use by another process, or a write failed."""


class WriteError(RunFolderError):
    """A write to the run folder failed (a full disk, a read-only folder, an I/O error)."""

    exit_status = 74  # EX_IOERR: the machine, not a setting, needs attention


# A resume point: ``epoch`` finished epochs, plus ``step`` steps of the next one (0: at an
# epoch's end); ``metrics``: the metric trackers' state inside that epoch ({name: [values]});
# ``positions``: each input pipeline's place in that epoch's order (``data.StreamPosition.at``),
# None when not recorded (arrays, an epoch's end, caco_tf 0.3.0 and earlier).
ResumePoint = collections.namedtuple(
    "ResumePoint", "epoch step weights steps_per_epoch metrics iterations version positions",
    defaults=(None,))


class RunFolder:
    """The paths of one run folder (``RunFolder(path).history`` ...) and its resume state."""

    def __init__(self, path):
        self.path = str(path)
        self.newest = None  # (epoch, step, file) of the last resume checkpoint written here

    def _join(self, *parts):
        return os.path.join(self.path, *parts)

    @property
    def config(self):
        return self._join("config.yaml")

    @property
    def backup(self):
        return self._join("backup")

    @property
    def checkpoint(self):
        return self._join("checkpoints", "last.weights.h5")

    @property
    def history(self):
        return self._join("history.json")

    @property
    def tensorboard(self):
        return self._join("tensorboard")

    @property
    def skipped_files(self):
        return self._join("skipped_files.txt")

    @property
    def model(self):
        return self._join("model.keras")

    @property
    def saved_model(self):
        return self._join("saved_model")

    @property
    def results(self):
        return self._join("results.json")

    @property
    def import_record(self):
        return self._join("import.json")

    @property
    def figures(self):
        return self._join("figures")

    def evaluation_record(self, name):
        """``eval_<name>.json``: what ``caco-evaluate`` measured (name: the protocol, then the
        baseline and the data, if any)."""
        return self._join(f"eval_{name}.json")

    @property
    def lock_path(self):
        return self._join(".lock")

    def has_backup(self):
        return os.path.exists(os.path.join(self.backup, METADATA))

    # ------------------------------------------------------------------ one writer
    def lock(self):
        """Take the folder for this process (a ``RunLock``, released when the process ends,
        however it ends); a ``RunFolderError`` naming the holder if another process has it."""
        return RunLock(self.lock_path, self.path)

    def discard_if_valueless(self):
        """Remove the run folder if it holds only ``SET_UP_FILES`` (and empty folders), as a
        run that failed before its first save leaves it; returns whether it did.

        Call it holding the folder's lock (``lock``): a folder another process holds, or
        one with a checkpoint, a history or any file of the user's, is never removed."""
        try:
            for root, _, files in os.walk(self.path, onerror=_raise):
                if any(root != self.path or name not in SET_UP_FILES for name in files):
                    return False
        except OSError:
            return False
        shutil.rmtree(self.path, ignore_errors=True)
        return not os.path.exists(self.path)

    # ------------------------------------------------------------------ resume state
    def read_backup(self):
        """The newest intact resume point, or None when there is none.

        A damaged newest checkpoint (size or CRC-32 not as recorded) is passed over for the
        previous one with one warning line; when every recorded checkpoint is damaged, a
        ``RunFolderError`` says so.  Also reads the one-file layouts written before
        checksums (``epoch-NNNN.weights.h5``, Keras' ``latest.weights.h5``).
        """
        entries = self._entries()
        if entries is None:
            return None
        damaged = []
        for entry in entries:
            reason = self._damage(entry)
            if reason is None:
                if damaged:
                    log.warning("warning: the latest checkpoint %s is damaged (%s); resuming "
                                "from the previous one (epoch %d, step %d of it)", *damaged[0],
                                entry["epoch"] + 1, entry.get("step", 0))
                return ResumePoint(int(entry["epoch"]), int(entry.get("step", 0)),
                                   os.path.join(self.backup, entry["weights"]),
                                   entry.get("steps_per_epoch"), entry.get("metrics") or {},
                                   entry.get("iterations"), entry.get("version"),
                                   entry.get("positions"))
            damaged.append((os.path.join(self.backup, entry["weights"]), reason))
        if not damaged:
            return None
        raise RunFolderError(
            f"cannot resume {self.path}: every checkpoint in {self.backup} is damaged "
            f"({'; '.join(f'{path}: {reason}' for path, reason in damaged)}); move that "
            f"folder away to start the run again")

    def _entries(self):
        path = os.path.join(self.backup, METADATA)
        try:
            with open(path) as handle:
                metadata = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            raise self._damaged_metadata(path, error) from error
        try:
            if not isinstance(metadata, dict):
                raise ValueError(f"a JSON {type(metadata).__name__}, not an object")
            if "checkpoints" in metadata:
                entries = metadata["checkpoints"]
                if not isinstance(entries, list) or not entries:
                    raise ValueError("'checkpoints' is not a list of checkpoints")
            else:  # one checkpoint, no checksum: this library's first layout, or Keras' own
                entries = [{"epoch": metadata["epoch"], "step": 0,
                            "weights": metadata.get("weights", "latest.weights.h5"),
                            "steps_per_epoch": metadata.get("steps_per_epoch")}]
            for entry in entries:
                _check_entry(entry)
        except (KeyError, TypeError, ValueError) as error:
            reason = f"no {error}" if isinstance(error, KeyError) else str(error)
            raise self._damaged_metadata(path, reason) from None
        return entries

    def read_decided(self):
        """What the run decided from its machines (``training_metadata.json``'s ``decided``:
        {setting: value}), or {} before its first save."""
        try:
            with open(os.path.join(self.backup, METADATA)) as handle:
                decided = json.load(handle).get("decided") or {}
        except (OSError, ValueError, AttributeError):
            return {}
        return decided if isinstance(decided, dict) else {}

    def _damaged_metadata(self, path, reason):
        return RunFolderError(
            f"cannot read {path}: {reason}; it says which checkpoint of {self.backup} to resume "
            f"from: restore it, or move {self.backup} away to start the run again")

    def _damage(self, entry):
        """Why a recorded checkpoint cannot be used, or None."""
        path = os.path.join(self.backup, entry["weights"])
        try:
            size = os.path.getsize(path)
        except OSError:
            return "missing"
        if "bytes" in entry and size != entry["bytes"]:
            return f"{size} bytes, {entry['bytes']} written"
        if "crc32" in entry and file_crc32(path) != entry["crc32"]:
            return "its checksum does not match"
        return None

    def write_backup(self, model, epoch, step, steps_per_epoch, metrics=None, positions=None,
                     decided=None):
        """Save the full training state as the newest resume point: ``epoch`` finished epochs
        and ``step`` steps of the next, with each input pipeline's place in the epoch's order
        (``positions``, see ``ResumePoint``) and what the run decided from its machines
        (``decided``: kept from the previous metadata when None).  A failed write raises
        ``WriteError`` and leaves the previous resume point as it was."""
        iterations = int(model.optimizer.iterations.numpy())
        name = f"state-{iterations:010d}.weights.h5"
        final = os.path.join(self.backup, name)
        partial = os.path.join(self.backup, ".partial.weights.h5")
        state = weights_bytes(model)
        try:
            os.makedirs(self.backup, exist_ok=True)
            _write_synced(partial, state)
            entry = {"epoch": int(epoch), "step": int(step), "iterations": iterations,
                     "weights": name, "steps_per_epoch": steps_per_epoch,
                     "bytes": len(state), "crc32": zlib.crc32(state),
                     "metrics": metrics or {}, "version": __version__,
                     "saved": datetime.datetime.now().isoformat(timespec="seconds")}
            if positions is not None:
                entry["positions"] = positions
            os.replace(partial, final)
            previous = [e for e in (self._entries() or []) if e["weights"] != name]
            kept = [e for e in previous if os.path.exists(os.path.join(self.backup, e["weights"]))]
            entries = [entry] + kept[:KEPT - 1]
            metadata = {"checkpoints": entries}
            decided = decided if decided is not None else self.read_decided()
            if decided:
                metadata["decided"] = decided
            write_json_atomically(os.path.join(self.backup, METADATA), metadata)
        except OSError as error:
            _remove_quietly(partial)
            raise WriteError(_write_message(*_failure(error, final),
                                            self._describe_newest())) from error
        self.newest = (int(epoch), int(step), final)
        kept = {e["weights"] for e in entries}
        for old in os.listdir(self.backup):
            if old.endswith((".weights.h5", ".bkp")) and old not in kept:
                _remove_quietly(os.path.join(self.backup, old))

    def _describe_newest(self):
        try:
            point = self.read_backup()
        except RunFolderError:
            point = None
        if point is None:
            return "no earlier checkpoint exists"
        return (f"the previous checkpoint (epoch {point.epoch + 1}, step {point.step}) is "
                f"intact") if point.step else (
            f"the previous checkpoint (after epoch {point.epoch}) is intact")


def read_history(path):
    """The rows of a ``history.json`` (one object with an ``epoch`` number per finished epoch;
    [] when there is none); a ``ValueError`` saying what is wrong with a damaged one."""
    try:
        with open(path) as handle:
            rows = json.load(handle)
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as error:
        raise ValueError(f"not text ({error.reason})") from None
    except ValueError as error:  # cut by a crash, or edited by hand
        raise ValueError(f"not valid JSON ({error})") from None
    if not isinstance(rows, list) or not all(
            isinstance(row, dict) and isinstance(row.get("epoch"), int) for row in rows):
        raise ValueError("not a list of epochs, each an object with its 'epoch' number")
    return rows


# What each field of a checkpoint's entry in training_metadata.json holds (None: may be absent).
_ENTRY_FIELDS = {"epoch": int, "step": (int, None), "iterations": (int, None),
                 "weights": str, "steps_per_epoch": (int, None), "bytes": (int, None),
                 "crc32": (int, None), "metrics": (dict, None), "version": (str, None),
                 "positions": (list, None)}


def _check_entry(entry):
    """A ``ValueError`` saying what is wrong with one checkpoint's entry, if anything."""
    if not isinstance(entry, dict):
        raise ValueError(f"a checkpoint's entry is a JSON {type(entry).__name__}, not an object")
    for field, kinds in _ENTRY_FIELDS.items():
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        value = entry.get(field)
        if value is None and None in kinds:
            continue
        types = tuple(kind for kind in kinds if kind is not None)
        if not isinstance(value, types) or isinstance(value, bool) or (
                isinstance(value, int) and value < 0):
            raise ValueError(f"a checkpoint's {field!r} is {value!r}")
    if os.path.basename(entry["weights"]) != entry["weights"] or entry["weights"] in ("", ".."):
        raise ValueError(f"a checkpoint's 'weights' is {entry['weights']!r}, not a file name")
    for position in entry.get("positions") or ():
        if not (isinstance(position, dict) and isinstance(position.get("items"), int)
                and position["items"] >= 0 and isinstance(position.get("bad"), list) and all(
                    isinstance(bad, list) and len(bad) == 2 and isinstance(bad[0], int)
                    and isinstance(bad[1], str) for bad in position["bad"])):
            raise ValueError(f"a checkpoint's stream position {position!r} is not "
                             f"{{'items': count, 'bad': [[number, name], ...]}}")
    for name, values in (entry.get("metrics") or {}).items():
        if not (isinstance(values, list) and all(isinstance(v, (int, float, list))
                                                 for v in values)):
            raise ValueError(f"a checkpoint's metric {name!r} is {values!r}")


def write_error(error, path, flag="--run-dir"):
    """A ``WriteError`` of one line from an ``OSError`` (or h5py's ``RuntimeError``) met while
    writing ``path``; ``flag``: the command's option that names another place."""
    return WriteError(_write_message(*_failure(error, path), flag=flag))


def _failure(error, path):
    """(the path, the cause, what to do) of a failed write."""
    code = getattr(error, "errno", None)
    cause = getattr(error, "strerror", None) if code else None
    if code is None:  # h5py and TensorFlow write the errno into their message
        code = errno_in(error)
        cause = os.strerror(code) if code else str(error)
    return getattr(error, "filename", None) or path, cause, write_advice(code)


def write_advice(code, place="the run folder"):
    """What to do about a write that failed with errno ``code`` in ``place``."""
    return {errno.ENOSPC: "free space on its disk", errno.EDQUOT: "free space on its disk",
            errno.EROFS: f"make {place} writable", errno.EACCES: f"make {place} writable",
            errno.EPERM: f"make {place} writable"}.get(code, "check the disk")


def _write_message(path, cause, advice, kept=None, flag="--run-dir"):
    kept = f"; {kept}" if kept else ""
    return (f"cannot write {path}: {cause}{kept}; {advice} (or pass another {flag}), then "
            f"run the same command to continue")


def is_write_failure(error):
    """Whether an exception is a failed write: an ``OSError``, or h5py's ``RuntimeError``
    carrying an errno."""
    return isinstance(error, OSError) or errno_in(error) is not None


def errno_in(error):
    """The errno that h5py and TensorFlow write into their messages ("errno = 28", or its
    words: "No space left on device"), or None."""
    found = re.search(r"errno = (\d+)", str(error))
    if found:
        return int(found.group(1))
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO):
        if os.strerror(code) in str(error):
            return code
    return None


def space_needed(model, exported=True):
    """(bytes, what they are) that a run of ``model`` writes at most at once into its folder:
    the resume checkpoints (newest, previous, and one being written), the weights checkpoint,
    and, when ``exported``, ``model.keras`` and the SavedModel, estimated from the variables'
    sizes."""
    def size(variables):
        return sum(_bytes_of(variable) for variable in variables)

    arrays = list(model.weights) + list(model.optimizer.variables)
    if not getattr(model.optimizer, "built", True):
        arrays += list(model.trainable_weights)  # its momentum, made at its first step
    state = size(arrays) + 1024 * len(arrays) + (64 << 10)  # and the file's own structure
    encoders = [getattr(model, name, None) for name in ("backbone", "query_encoder")]
    saved = sum(size(e.weights) for e in encoders if e is not None) + (2 << 20)  # + graphs
    checkpoints = (KEPT + 1) * state
    if not exported:
        return (checkpoints + state, f"resume checkpoints {KEPT + 1} x {state / 2**20:.1f} MiB "
                f"and the weights checkpoint {state / 2**20:.1f} MiB")
    return (checkpoints + state + state + saved,
            f"resume checkpoints {KEPT + 1} x {state / 2**20:.1f} MiB, the weights checkpoint "
            f"and model.keras {state / 2**20:.1f} MiB each, the SavedModel "
            f"{saved / 2**20:.1f} MiB")


def _bytes_of(variable):
    import tensorflow as tf

    count = 1
    for dimension in variable.shape:
        count *= int(dimension)
    return count * tf.dtypes.as_dtype(variable.dtype).size


def size_of(*paths):
    """Bytes in the files at ``paths`` (folders: every file under them; missing: 0)."""
    total = 0
    for path in paths:
        if os.path.isfile(path):
            total += os.path.getsize(path)
        for root, _, files in os.walk(path):
            total += sum(os.path.getsize(os.path.join(root, name)) for name in files
                         if os.path.isfile(os.path.join(root, name)))
    return total


class RunLock:
    """An exclusive lock on a run folder (``fcntl.lockf`` on ``.lock``), recording who holds
    it.  The operating system releases it when the holder ends, even by SIGKILL, so a lock
    left by a dead process never blocks a relaunch."""

    def __init__(self, path, folder):
        self.path, self.handle = path, None
        while True:
            handle = self._take(path, folder)
            # A holder that removed the folder (a run that failed before its first save) may
            # have released the lock of a file that no longer has this name: take the new one.
            try:
                if os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino:
                    break
            except FileNotFoundError:
                pass
            handle.close()
        handle.seek(0)
        handle.truncate()
        json.dump({"host": socket.gethostname(), "pid": os.getpid(),
                   "started": datetime.datetime.now().isoformat(timespec="seconds")}, handle)
        handle.flush()
        self.handle = handle

    @staticmethod
    def _take(path, folder):
        import fcntl

        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a+")
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            handle.seek(0)
            try:
                holder = json.loads(handle.read() or "{}")
            except ValueError:
                holder = {}
            handle.close()
            if error.errno not in (errno.EACCES, errno.EAGAIN):
                raise write_error(error, path) from error
            raise RunFolderError(
                f"{folder} is in use by process {holder.get('pid', '?')} on "
                f"{holder.get('host', '?')} (since {holder.get('started', '?')}): wait for it "
                f"to end or stop it, or pass another --run-dir") from None
        return handle

    def release(self):
        if self.handle is not None:
            self.handle.close()  # closing releases the lock
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def weights_bytes(model):
    """The bytes of ``model.save_weights``'s ``.weights.h5`` file, made in memory.

    Files are then written by plain file I/O, so that a full or failing disk is an
    ``OSError`` on our side; an h5py file that fails mid-write is left half-open and can crash
    the interpreter when freed at exit.
    """
    import io

    from caco_tf import keras_compat  # Keras only when weights are written

    buffer = io.BytesIO()
    keras_compat.write_weights_file(model, buffer)
    return buffer.getvalue()


def weight_arrays(path):
    """Every array of a ``.weights.h5`` file (model and optimizer), by its path in the file:
    what compares two runs' states bit for bit."""
    import h5py

    arrays = {}
    with h5py.File(path, "r") as handle:
        handle.visititems(lambda name, item: arrays.__setitem__(name, item[()])
                          if isinstance(item, h5py.Dataset) else None)
    return arrays


def save_weights_atomically(model, path):
    """``model.save_weights(path)``, the file complete on the disk before it takes the name:
    a kill or a full disk leaves the previous file, never half of a new one."""
    partial = os.path.join(os.path.dirname(path), ".partial." + os.path.basename(path))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write_synced(partial, weights_bytes(model))
        os.replace(partial, path)
    except OSError:
        _remove_quietly(partial)
        raise
    _flush_folder(os.path.dirname(path))


def link_atomically(source, path):
    """``path`` made a hard link of the finished file ``source`` (the same bytes, written
    once), replacing what had the name at once; False where the file system has no hard
    links."""
    partial = os.path.join(os.path.dirname(path), ".partial." + os.path.basename(path))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _remove_quietly(partial)
        os.link(source, partial)
        os.replace(partial, path)
    except OSError as error:
        _remove_quietly(partial)
        if error.errno in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.ENOSYS):
            return False
        raise
    _flush_folder(os.path.dirname(path))
    return True


def _write_synced(path, contents):
    with open(path, "wb") as handle:
        handle.write(contents)
        handle.flush()
        os.fsync(handle.fileno())


def file_crc32(path, chunk=1 << 22):
    value = 0
    with open(path, "rb") as handle:
        while True:
            block = handle.read(chunk)
            if not block:
                return value
            value = zlib.crc32(block, value)


def write_json_atomically(path, value, indent=None):
    """Write JSON under a temporary name, flush it to the disk, then rename it into place: a
    reader sees the old file or the new one, never half of one."""
    write_text_atomically(path, json.dumps(value, indent=indent))


def write_text_atomically(path, text):
    """``write_json_atomically`` for any text."""
    temporary = path + ".tmp"
    try:
        with open(temporary, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError:
        _remove_quietly(temporary)
        raise
    _flush_folder(os.path.dirname(path))


def _flush_folder(path):
    try:
        descriptor = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some file systems cannot sync a folder; the rename is still atomic
    finally:
        os.close(descriptor)


def _raise(error):
    raise error


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass
