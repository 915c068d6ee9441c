"""Where a submission's jobs run from, worked out on the submitting machine: the working
directory (``workdir``), its repository state (``git``), the Python environment
(``environment``) and, for ``code: snapshot``, a bundle of its code (``snapshot``).

Not sans-IO as ``_ops`` is: this module reads the filesystem (the directory checked, the
files bundled) and runs ``git`` as a subprocess in the working directory. It sends nothing:
``_ops.submit`` uploads the bundle and posts the submission.

The bundle follows the rules the Rust CLI writes and the agent unpacks: a gzip-compressed tar,
the same bytes for the same tree (entries sorted by path, owner 0, mtime 0, modes 0o755 or
0o644, gzip header mtime 0), regular files and symbolic links that stay inside the tree, no
directory entries. Its files: in a git work tree, what ``git ls-files --cached --others
--exclude-standard`` lists at the top (tracked files as they are now, untracked ones not
ignored; submodules left out); elsewhere, a walk of the working directory (``.git``,
``.headroom``, ``__pycache__`` and venvs left out, and what ``.headroomignore`` names).
Nothing under a ``.headroom`` directory is ever bundled: headroom's data directory holds an
admin token."""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import posixpath
import re
import stat
import subprocess
import tarfile
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Mapping, Optional, Set, Tuple, Union

from ._spec import VARIANTS_KEY, SpecLike, load_spec, merged
from ._transport import PathLike
from .errors import SourceError

#: The most a code bundle may weigh, compressed (``submit(max_snapshot_bytes=...)``).
MAX_SNAPSHOT_BYTES = 100 * 1024 * 1024
#: How long one git command may take; past it the repository state is left out.
GIT_TIMEOUT_S = 60.0
#: Directories a walk (outside git) never bundles, by name.
SKIPPED_DIRS = frozenset({".git", "__pycache__"})
#: Files never bundled by name: headroom's tokens.
TOKEN_FILES = frozenset({"admin-token", "agent-token", "join-token"})


def _never_bundled(rel: str) -> bool:
    """headroom's own state (a data directory such as ``.headroom`` or an agent's
    ``.headroom-agent`` holds credentials), its token files, git's folder, Python's caches."""
    parts = rel.split("/")
    return (
        any(p.startswith(".headroom") or p in SKIPPED_DIRS for p in parts)
        or parts[-1] in TOKEN_FILES
    )
#: Patterns of the files a walk leaves out, one per line, at the working directory's top.
IGNORE_FILE = ".headroomignore"

#: ``submit(environment=...)``: ``"inherit"`` (the activated venv or conda environment),
#: ``"none"``, ``{"venv": PATH}`` or ``{"conda": NAME_OR_PREFIX}``.
EnvironmentLike = Union[Literal["inherit", "none"], Mapping[str, str]]

_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


# ---- the working directory ----


def spec_dir(spec: SpecLike) -> Optional[str]:
    """The directory a spec file's relative paths are resolved against; None for a dict
    (its paths are resolved against the current directory)."""
    if isinstance(spec, dict):
        return None
    return os.path.dirname(os.path.abspath(os.fspath(spec)))


def _absolute(path: str, base: Optional[str]) -> str:
    """``path`` made absolute against ``base`` (else the current directory), normalized."""
    return os.path.normpath(os.path.join(base if base is not None else os.getcwd(), path))


def resolve_workdir(
    given: Optional[PathLike], spec_workdir: Any = None, base: Optional[str] = None
) -> str:
    """The directory the jobs run in, absolute: ``given`` (relative: to the current
    directory), else the spec's ``workdir`` (relative: to ``base``, the spec file's
    directory), else the current directory. Raises ``SourceError`` (field ``workdir``) when
    it is not a directory here."""
    if given is not None:
        path = _absolute(os.fspath(given), None)
    elif spec_workdir is not None:
        if not isinstance(spec_workdir, str) or not spec_workdir:
            raise SourceError("workdir", f"the spec's workdir is {spec_workdir!r}, not a path")
        path = _absolute(spec_workdir, base)
    else:
        path = os.getcwd()
    if not os.path.isdir(path):
        why = "is not a directory" if os.path.exists(path) else "does not exist"
        raise SourceError("workdir", f"the working directory {path} {why}")
    return path


# ---- the environment ----


def inherited_environment() -> Optional[Dict[str, str]]:
    """The submitter's activated environment: ``$VIRTUAL_ENV``, else ``$CONDA_PREFIX``."""
    if os.environ.get("VIRTUAL_ENV"):
        return {"venv": os.environ["VIRTUAL_ENV"]}
    if os.environ.get("CONDA_PREFIX"):
        return {"conda": os.environ["CONDA_PREFIX"]}
    return None


def resolve_environment(
    given: Any, base: Optional[str] = None, origin: str = "the spec's"
) -> Optional[Dict[str, str]]:
    """What a submission sends as ``environment``: for ``inherit`` (or None) the activated
    one, for ``none`` nothing, for ``{venv: PATH}`` the path made absolute against ``base``
    (the spec file's directory; else the current directory), for ``{conda: NAME}`` the name
    (a relative prefix, holding a ``/``, made absolute). Anything else raises
    ``SourceError`` (field ``environment``); ``origin`` says whose value it was."""
    if given is None or given == "inherit":
        return inherited_environment()
    if given == "none":
        return None
    if isinstance(given, Mapping) and len(given) == 1:
        ((kind, value),) = given.items()
        if kind in ("venv", "conda") and isinstance(value, str) and value:
            # A conda name never holds a `/`: a value that does is a prefix.
            if kind == "venv" or "/" in value:
                value = _absolute(value, base)
            return {str(kind): value}
    raise SourceError(
        "environment",
        f"{origin} environment is {given!r}: it is `inherit`, `none`, {{venv: PATH}} or "
        "{conda: NAME}",
    )


# ---- git ----


def _git(cwd: str, *args: str) -> Optional[bytes]:
    """A git command's output; None when it failed, or git is missing or too slow."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            # A read-only look: `git status` must not take the index's lock from the user.
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _line(out: Optional[bytes]) -> Optional[str]:
    """A one-line answer of git (its newline cut; a path may hold any other byte)."""
    if out is None:
        return None
    return os.fsdecode(out[:-1] if out.endswith(b"\n") else out)


def repo_root(workdir: str) -> Optional[str]:
    """The top of the git work tree ``workdir`` is in; None when it is in none."""
    top = _line(_git(workdir, "rev-parse", "--show-toplevel"))
    return top or None


def git_state(workdir: str) -> Optional[Dict[str, Any]]:
    """The repository state of ``workdir`` as a submission sends it: ``commit``, ``branch``
    (left out on a detached HEAD), ``dirty`` and ``diff_hash`` (left out when clean). None
    when it is no git work tree, git is missing or fails, or HEAD has no commit yet: a
    submission is never refused for it."""
    root = repo_root(workdir)
    if root is None:
        return None
    commit = _line(_git(root, "rev-parse", "--verify", "-q", "HEAD"))
    if commit is None or not _COMMIT.match(commit):
        return None
    status = _git(root, "status", "--porcelain", "--untracked-files=normal")
    if status is None:
        return None
    state: Dict[str, Any] = {"commit": commit}
    branch = _line(_git(root, "symbolic-ref", "-q", "--short", "HEAD"))
    if branch:
        state["branch"] = branch
    state["dirty"] = bool(status.strip())
    if state["dirty"]:
        digest = diff_hash(root)
        if digest is not None:
            state["diff_hash"] = digest
    return state


def diff_hash(root: str) -> Optional[str]:
    """SHA-256 (hex) of the uncommitted changes of the work tree at ``root``: the bytes of
    ``git diff HEAD --binary``, then for each untracked file not ignored (sorted by path) its
    path, a NUL byte and its content (a symbolic link's: its target). None when git fails or
    a file cannot be read."""
    # The user's diff drivers and colours would make the bytes differ from one shell to
    # another; the diff itself is git's.
    diff = _git(root, "diff", "HEAD", "--binary", "--no-ext-diff", "--no-textconv", "--no-color")
    others = _git(root, "ls-files", "-z", "--others", "--exclude-standard")
    if diff is None or others is None:
        return None
    h = hashlib.sha256(diff)
    broot = os.fsencode(root)
    try:
        for rel in sorted(p for p in others.split(b"\0") if p):
            full = os.path.join(broot, rel)
            if os.path.islink(full):
                h.update(rel + b"\0" + os.readlink(full))
            elif os.path.isfile(full):
                h.update(rel + b"\0")
                with open(full, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
            # else: a nested repository (`sub/`), or gone since it was listed
    except OSError:
        return None
    return h.hexdigest()


# ---- the bundle ----


@dataclass(frozen=True)
class Bundle:
    """A code bundle: its bytes, their SHA-256 (hex), the tree it was taken from (``root``),
    the working directory within it (``subdir``, ``""`` at the top) and its files (paths
    relative to ``root``, in the order bundled)."""

    data: bytes = field(repr=False)
    hash: str
    root: str
    subdir: str
    files: List[str]


class _Ignore:
    """The patterns of a ``.headroomignore``, gitignore-like: ``#`` comments, ``!`` to keep
    again, a trailing ``/`` for directories only, a leading ``/`` (or one inside) anchors to
    the top; a pattern without ``/`` matches a name at any depth. fnmatch's ``*`` also
    matches ``/``, so ``**`` works as in git for the common cases. The last match wins."""

    def __init__(self, lines: List[str]) -> None:
        self.rules: List[Tuple[str, bool, bool, bool]] = []  # pattern, keep, dirs only, anchored
        for raw in lines:
            line = raw.rstrip("\r\n").rstrip(" ")
            if not line or line.startswith("#"):
                continue
            keep = line.startswith("!")
            if keep:
                line = line[1:]
            if line.startswith(("\\#", "\\!")):
                line = line[1:]
            dirs_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            line = line.lstrip("/")
            if line:
                self.rules.append((line, keep, dirs_only, anchored))

    @classmethod
    def read(cls, root: str) -> "_Ignore":
        try:
            with open(os.path.join(root, IGNORE_FILE), encoding="utf-8") as f:
                return cls(f.read().splitlines())
        except FileNotFoundError:
            return cls([])
        except (OSError, UnicodeDecodeError) as e:
            raise SourceError("snapshot", f"{root}/{IGNORE_FILE} cannot be read: {e}") from e

    def ignores(self, rel: str, is_dir: bool) -> bool:
        hit = False
        name = posixpath.basename(rel)
        for pattern, keep, dirs_only, anchored in self.rules:
            if dirs_only and not is_dir:
                continue
            if anchored:
                matched = fnmatch.fnmatchcase(rel, pattern) or (
                    pattern.startswith("**/") and fnmatch.fnmatchcase(rel, pattern[3:])
                )
            else:
                matched = fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(rel, pattern)
            if matched:
                hit = not keep
        return hit


def _bundled_kind(full: str) -> Optional[os.stat_result]:
    """Its ``lstat`` when it is a regular file or a symbolic link; None otherwise (gone, a
    directory, a socket...)."""
    try:
        st = os.lstat(full)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) else None


def _git_files(root: str) -> Optional[List[str]]:
    """The files git would bundle: tracked (as they are now) and untracked not ignored;
    deleted files, submodules and anything under ``.headroom/`` left out."""
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is None:
        return None
    files = set()
    for raw in listed.split(b"\0"):
        rel = os.fsdecode(raw).rstrip("/")
        if not rel or _never_bundled(rel):
            continue
        if _bundled_kind(os.path.join(root, rel)) is not None:
            files.add(rel)
    return list(files)


def _walked_files(root: str) -> List[str]:
    """The files of a walk of ``root`` (not a git work tree)."""
    ignore = _Ignore.read(root)

    def unreadable(e: OSError) -> None:
        raise SourceError("snapshot", f"{e.filename} cannot be read: {e.strerror or e}")

    files: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        top = os.path.relpath(dirpath, root)
        at = "" if top == "." else top.replace(os.sep, "/") + "/"
        keep = []
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                filenames.append(d)  # a link to a directory is bundled as a link
            elif not (
                _never_bundled(d)
                # A data directory of another name: `headroom up` writes a `.gitignore` of `*`.
                or _ignores_everything(full)
                or os.path.isfile(os.path.join(full, "pyvenv.cfg"))  # a venv
                or ignore.ignores(at + d, True)
            ):
                keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            rel = at + name
            kind = _bundled_kind(os.path.join(root, rel))
            if kind is not None and not _never_bundled(rel) and not ignore.ignores(rel, False):
                files.append(rel)
    return files


def _ignores_everything(directory: str) -> bool:
    """Whether ``directory`` holds a ``.gitignore`` of ``*`` (a venv's or a data
    directory's way of keeping itself out)."""
    try:
        with open(os.path.join(directory, ".gitignore"), encoding="utf-8") as f:
            return any(line.strip() == "*" for line in f)
    except OSError:
        return False


def bundle_files(workdir: str) -> Tuple[str, str, List[str], bool]:
    """What a bundle of ``workdir`` holds: its root, ``workdir`` within it, its files
    (relative to the root, sorted by their bytes) and whether git chose them."""
    root = repo_root(workdir)
    if root is not None:
        files = _git_files(root)
        prefix = _line(_git(workdir, "rev-parse", "--show-prefix"))
        if files is not None and prefix is not None:
            return root, prefix.rstrip("/"), sorted(files, key=os.fsencode), True
    real = os.path.realpath(workdir)
    if real == "/" or real == os.path.realpath(os.path.expanduser("~")):
        raise SourceError(
            "snapshot",
            f"{workdir} is not a project's directory (a home or the root): submit from the project",
        )
    return workdir, "", sorted(_walked_files(workdir), key=os.fsencode), False


def _inside(rel: str, target: str) -> bool:
    """Whether a link at ``rel`` to ``target`` stays inside the bundle's root."""
    if posixpath.isabs(target):
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return resolved != ".." and not resolved.startswith("../")


def _info(rel: str, st: os.stat_result) -> tarfile.TarInfo:
    # Nothing of the machine or the moment: the same tree gives the same bytes.
    info = tarfile.TarInfo(rel)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    info.size = st.st_size
    return info


def _add(tar: tarfile.TarFile, root: str, rel: str) -> None:
    full = os.path.join(root, rel)
    try:
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(full)
            if not _inside(rel, target):
                raise SourceError(
                    "snapshot",
                    f"{rel} is a symbolic link to {target}, outside the bundled tree "
                    f"({root}): the bundle cannot hold it; make it relative and inside, or "
                    "leave it out (.gitignore in a git work tree, .headroomignore elsewhere)",
                )
            info = _info(rel, st)
            info.type, info.linkname, info.mode, info.size = tarfile.SYMTYPE, target, 0o777, 0
            tar.addfile(info)
            return
        with open(full, "rb") as f:
            # The size read now: a file that shrinks while it is read fails below.
            tar.addfile(_info(rel, os.fstat(f.fileno())), f)
    except OSError as e:
        raise SourceError("snapshot", f"{rel} cannot be bundled: {e.strerror or e}") from e


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _over_cap(
    root: str, files: List[str], done: int, size: int, cap: int, by_git: bool
) -> SourceError:
    sizes: Dict[str, int] = {}
    for rel in files:
        st = _bundled_kind(os.path.join(root, rel))
        sizes[rel] = st.st_size if st is not None else 0
    largest = sorted(sizes, key=lambda r: (-sizes[r], r))[:5]
    so_far = "" if done == len(files) else f"at least (stopped after {done} of {len(files)} files) "
    how = (
        "git-ignored files are not bundled: add the rest to .gitignore"
        if by_git
        else f"list the rest in {os.path.join(root, IGNORE_FILE)} (gitignore-like patterns)"
    )
    total = _size(sum(sizes.values()))
    return SourceError(
        "snapshot",
        f"the code bundle of {root} is {so_far}{_size(size)} compressed, over its cap of "
        f"{_size(cap)} (max_snapshot_bytes); its {len(files)} files hold {total}, "
        f"the largest: {', '.join(f'{r} ({_size(sizes[r])})' for r in largest)}. Bundle only "
        f"what the jobs need: {how}",
    )


def make_bundle(workdir: str, max_bytes: int = MAX_SNAPSHOT_BYTES) -> Bundle:
    """The code bundle of ``workdir`` (see the module's docstring). Raises ``SourceError``
    (field ``snapshot``) when it would be over ``max_bytes`` compressed, or a file cannot be
    bundled (a link out of the tree, an unreadable file)."""
    root, subdir, files, by_git = bundle_files(os.path.abspath(workdir))
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=buf, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for i, rel in enumerate(files):
                _add(tar, root, rel)
                # Stop early: a tree of gigabytes need not be compressed to be refused.
                if buf.tell() > max_bytes:
                    raise _over_cap(root, files, i + 1, buf.tell(), max_bytes, by_git)
    data = buf.getvalue()
    if len(data) > max_bytes:
        raise _over_cap(root, files, len(files), len(data), max_bytes, by_git)
    return Bundle(data, hashlib.sha256(data).hexdigest(), root, subdir, files)


# ---- what this host can tell of the nodes' ----


def is_local(url: str) -> bool:
    """Whether the coordinator at ``url`` is this host's (a loopback address): what its
    jobs see of the file system is what this host sees."""
    host = urllib.parse.urlsplit(url).hostname or ""
    return host == "localhost" or host == "::1" or host.startswith("127.")


def enterable_by(directory: str, user: str) -> None:
    """Raises ``SourceError`` naming ``workdir`` when the Unix ``user`` (the one the jobs
    run as, known on this host) may not enter ``directory``, by the modes of it and the
    folders above it, as the agent judges it; a user this host does not know is the nodes'
    to resolve."""
    import pwd

    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return
    if pw.pw_uid == 0:
        return
    groups = set(os.getgrouplist(user, pw.pw_gid))
    way = ["/"]
    for part in [p for p in os.path.realpath(directory).split("/") if p]:
        way.append(posixpath.join(way[-1], part))
    for d in way:
        try:
            st = os.stat(d)
        except OSError:
            return
        if st.st_uid == pw.pw_uid:
            bit = 0o100
        elif st.st_gid in groups:
            bit = 0o010
        else:
            bit = 0o001
        if not st.st_mode & bit:
            try:
                owner = pwd.getpwuid(st.st_uid).pw_name
            except KeyError:
                owner = f"uid {st.st_uid}"
            raise SourceError(
                "workdir",
                f"your jobs run as `{user}` here, who may not enter {directory}: it may not "
                f"search (x) {d} (owner {owner}, mode {st.st_mode & 0o7777:o}). Open the folder "
                "to them, submit from a directory they may enter, or map your user to another "
                "Unix user (`headroom user create NAME --unix-user USER`)",
            )


# ---- the submission ----


@dataclass(frozen=True)
class Submission:
    """What ``submit`` sends: the request's body; the code bundles to upload first, one per
    distinct bundle (none without ``code: snapshot``, or on a dry run): the top level's, then
    a study's variants' own; and the working directories the jobs run in from this host's
    tree rather than from a bundle (``entered``: the ones ``submit`` checks the jobs' Unix
    user may enter, where the coordinator is this host's)."""

    body: Dict[str, Any]
    bundles: Tuple[Bundle, ...] = ()
    entered: Tuple[str, ...] = ()


@dataclass(frozen=True)
class _Resolved:
    """Where one spec's (or one variant's) jobs run from, as the request says it."""

    workdir: str
    git: Optional[Dict[str, Any]]
    environment: Optional[Dict[str, str]]
    snapshot: Optional[Dict[str, str]]

    def fields(self) -> Dict[str, Any]:
        """The request's fields of that name (a variant's: ``variants.NAME``)."""
        out: Dict[str, Any] = {"workdir": self.workdir}
        if self.git is not None:
            out["git"] = self.git
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot
        if self.environment is not None:
            out["environment"] = self.environment
        return out


class _Sources:
    """Resolves sources, sharing what a study's variants have in common: a directory's git
    state is read and its bundle made once, however many variants run from it."""

    def __init__(self, dry_run: bool, max_bytes: int) -> None:
        self.dry_run = dry_run
        self.max_bytes = max_bytes
        self.gits: Dict[str, Optional[Dict[str, Any]]] = {}
        self.bundles: Dict[str, Bundle] = {}
        self.entered: List[str] = []

    def resolve(
        self, workdir: str, environment: Optional[Dict[str, str]], snapshot: bool
    ) -> _Resolved:
        if workdir not in self.gits:
            self.gits[workdir] = git_state(workdir)
        snap = None
        # A dry run stores nothing: no bundle is made or uploaded.
        if snapshot and not self.dry_run:
            bundle = self.bundles.get(workdir)
            if bundle is None:
                bundle = self.bundles[workdir] = make_bundle(workdir, self.max_bytes)
            snap = {"hash": bundle.hash, "subdir": bundle.subdir}
        if not snapshot and workdir not in self.entered:
            self.entered.append(workdir)
        return _Resolved(workdir, self.gits[workdir], environment, snap)

    def distinct_bundles(self) -> Tuple[Bundle, ...]:
        """Each bundle once: two directories of one git work tree bundle the same files."""
        by_hash: Dict[str, Bundle] = {}
        for b in self.bundles.values():
            by_hash.setdefault(b.hash, b)
        return tuple(by_hash.values())


def prepare_submission(
    spec: SpecLike,
    *,
    seed: Optional[int] = None,
    dry_run: bool = False,
    workdir: Optional[PathLike] = None,
    environment: Optional[EnvironmentLike] = None,
    snapshot: Optional[bool] = None,
    max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
) -> Submission:
    """The body of ``POST /v1/experiments`` for ``spec``, with its source: ``workdir``,
    ``git``, ``environment``, and ``snapshot`` (the bundle made; not on a dry run). The
    keywords override the spec's ``workdir``, ``environment`` and ``code``; the spec sent
    says what was resolved (its relative paths made absolute), so that it and the request
    agree. The caller's dict is not changed.

    A study (``experiments:``): the top level is resolved as above (the keywords stand for
    its keys, the defaults), then each variant's own merged spec the same way; a variant
    whose source differs from the top level's (another ``workdir``, ``environment`` or
    ``code``) is sent under ``variants.NAME``, its bundle made once per directory. A
    refusal names the variant's field (``experiments[1].workdir``) where it set the key."""
    doc = dict(load_spec(spec))
    base = spec_dir(spec)
    wd = resolve_workdir(workdir, doc.get("workdir"), base)
    if workdir is not None or "workdir" in doc:
        doc["workdir"] = wd
    if environment is not None:
        chosen: Any = environment
        env = resolve_environment(environment, None, "environment=")
    else:
        chosen = doc.get("environment")
        env = resolve_environment(chosen, base)
    if environment is not None or "environment" in doc:
        # A keyword as given (`inherit`: the server records the environment as the
        # submitter's), an environment as resolved.
        doc["environment"] = env if isinstance(chosen, Mapping) else (chosen or "inherit")
    if snapshot:
        doc["code"] = "snapshot"
    elif snapshot is not None and "code" in doc:
        doc["code"] = "checkout"

    sources = _Sources(dry_run, max_snapshot_bytes)
    top = sources.resolve(wd, env, doc.get("code") == "snapshot")
    body: Dict[str, Any] = {"spec": doc, "dry_run": dry_run, "workdir": wd}
    if seed is not None:
        body["seed"] = seed
    body.update({k: v for k, v in top.fields().items() if k != "workdir"})
    own = _variant_sources(doc, base, top, sources)
    if own:
        body["variants"] = own
    return Submission(body, sources.distinct_bundles(), tuple(sources.entered))


def _variant_sources(
    doc: Dict[str, Any], base: Optional[str], top: _Resolved, sources: _Sources
) -> Dict[str, Dict[str, Any]]:
    """A study's variants whose source is not ``top``'s, by name (``SubmitRequest.variants``);
    ``doc``'s variants get their own relative paths made absolute, as the top level does.
    Empty for a plain spec."""
    listed = doc.get(VARIANTS_KEY)
    if not isinstance(listed, list):
        return {}
    defaults = {k: v for k, v in doc.items() if k not in ("name", VARIANTS_KEY)}
    own: Dict[str, Dict[str, Any]] = {}
    variants: List[Any] = []
    for i, variant in enumerate(listed):
        name = variant.get("name") if isinstance(variant, dict) else None
        if not isinstance(variant, dict) or not isinstance(name, str):
            variants.append(variant)  # the coordinator refuses it, naming the field
            continue
        over = {k: v for k, v in variant.items() if k not in ("name", "after")}
        wanted = merged(defaults, over)
        try:
            wd = resolve_workdir(None, wanted.get("workdir"), base)
            env = resolve_environment(wanted.get("environment"), base)
            resolved = sources.resolve(wd, env, wanted.get("code") == "snapshot")
        except SourceError as e:
            raise _in_variant(e, i, name, set(over)) from None
        variant = dict(variant)
        if isinstance(over.get("workdir"), str):
            variant["workdir"] = wd
        if isinstance(over.get("environment"), Mapping):
            variant["environment"] = env
        variants.append(variant)
        if resolved != top:
            own[name] = resolved.fields()
    doc[VARIANTS_KEY] = variants
    return own


def _in_variant(e: SourceError, i: int, name: str, own: Set[str]) -> SourceError:
    """A refusal of variant ``i``'s source: at ``experiments[i].FIELD`` where the variant set
    the key itself (its bundle: where it set ``code`` or ``workdir``), else at the top
    level's field, naming the variant (as the coordinator places a variant's refusals)."""
    field = e.field or ""
    head = field.split(".")[0]
    if head in own or (head == "snapshot" and own & {"code", "workdir"}):
        return SourceError(f"{VARIANTS_KEY}[{i}].{field}", e.message)
    return SourceError(field, f"{e.message} (in variant `{name}`)")
