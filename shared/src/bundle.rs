//! Code bundles (`code: snapshot`): a project's tree as a gzip-compressed tar that is the
//! same bytes for the same tree (sorted entries, no owners, no times), named by the SHA-256
//! of its bytes. The CLI makes one at submit, the coordinator keeps it, agents unpack it.
//! Entries are regular files (mode 0755 or 0644) and symbolic links that stay inside the
//! tree; nothing else is written or read back.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// The largest bundle (compressed) clients make and coordinators keep, by default.
pub const DEFAULT_MAX_BYTES: u64 = 100 * 1024 * 1024;

/// The most a bundle unpacks to, and the most entries it holds: a node's disk is not
/// filled by a bundle that compresses a thousand to one.
pub const MAX_UNPACKED_BYTES: u64 = 8 * 1024 * 1024 * 1024;
pub const MAX_ENTRIES: u64 = 500_000;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is a link to {} outside the bundled tree: bundle what it points to instead, \
         or leave it out (.gitignore, .headroomignore)",
        path.display(),
        target.display()
    )]
    LinkOutside { path: PathBuf, target: PathBuf },
    #[error("{what}: {source}")]
    Archive {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the bundle holds {0}, which is not a file, a link or a folder inside it")]
    BadEntry(String),
    #[error("the bundle unpacks to more than {bytes} bytes or {entries} entries: refused")]
    TooLarge { bytes: u64, entries: u64 },
}

/// The SHA-256 of `bytes`, in lowercase hex: a bundle's name.
pub fn hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The bundle of `files` (paths relative to `root`; folders and vanished paths are skipped).
pub fn make(root: &Path, files: &[PathBuf]) -> Result<Vec<u8>, BundleError> {
    let mut files: Vec<&PathBuf> = files.iter().collect();
    files.sort();
    files.dedup();
    let gz = flate2::GzBuilder::new().write(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    let archive = |source| BundleError::Archive {
        what: "writing the bundle",
        source,
    };
    for rel in files {
        let path = root.join(rel);
        let read = |source| BundleError::Read {
            path: path.clone(),
            source,
        };
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(read(e)),
        };
        let mut header = tar::Header::new_gnu();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).map_err(read)?;
            if !stays_inside(rel, &target) {
                return Err(BundleError::LinkOutside {
                    path: rel.clone(),
                    target,
                });
            }
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_mode(0o777);
            header.set_size(0);
            tar.append_link(&mut header, rel, &target)
                .map_err(archive)?;
        } else if meta.is_file() {
            use std::os::unix::fs::PermissionsExt;
            let exec = meta.permissions().mode() & 0o111 != 0;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(if exec { 0o755 } else { 0o644 });
            header.set_size(meta.len());
            let file = std::fs::File::open(&path).map_err(read)?;
            // What is read is what the header says: a file that grew is cut, one that shrank
            // fails the bundle (the tar writer would pad it with zeros).
            let exact = Exact {
                inner: file.take(meta.len()),
                left: meta.len(),
            };
            tar.append_data(&mut header, rel, exact).map_err(read)?;
        }
    }
    let gz = tar.into_inner().map_err(archive)?;
    gz.finish().map_err(archive)
}

/// A reader of exactly `left` bytes: one that ends sooner is an error.
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was bundled",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Whether a link at `rel` to `target` points inside the tree it is in.
fn stays_inside(rel: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: i64 = rel.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// Unpacks `bytes` into `dest` (an empty folder): files, links inside the tree and folders
/// only; an entry that would land outside `dest` fails it.
pub fn unpack(bytes: &[u8], dest: &Path) -> Result<(), BundleError> {
    unpack_within(bytes, dest, MAX_UNPACKED_BYTES, MAX_ENTRIES)
}

/// [`unpack`] within `max_bytes` unpacked and `max_entries` entries.
fn unpack_within(
    bytes: &[u8],
    dest: &Path,
    max_bytes: u64,
    max_entries: u64,
) -> Result<(), BundleError> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    // Modes as `make` writes them (0755 or 0644): no set-id bit survives from a bundle.
    archive.set_preserve_permissions(false);
    archive.set_preserve_mtime(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(false);
    let bad = |source| BundleError::Archive {
        what: "reading the bundle",
        source,
    };
    let (mut bytes, mut entries) = (0u64, 0u64);
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        // The size the archive reads (a PAX record's over the header's).
        bytes = bytes.saturating_add(entry.size());
        entries += 1;
        if bytes > max_bytes || entries > max_entries {
            return Err(BundleError::TooLarge {
                bytes: max_bytes,
                entries: max_entries,
            });
        }
        let path = entry.path().map_err(bad)?.into_owned();
        let kind = entry.header().entry_type();
        let fine = match kind {
            tar::EntryType::Regular | tar::EntryType::Directory => true,
            tar::EntryType::Symlink => entry
                .link_name()
                .map_err(bad)?
                .is_some_and(|t| stays_inside(&path, &t)),
            _ => false,
        };
        if !fine || !entry.unpack_in(dest).map_err(bad)? {
            return Err(BundleError::BadEntry(path.display().to_string()));
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file beside it, renamed once complete.
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("part-{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("src/data")).expect("mkdir");
        std::fs::write(dir.path().join("train.py"), "print('v1')\n").expect("write");
        std::fs::write(dir.path().join("src/data/x.csv"), "1,2\n").expect("write");
        std::os::unix::fs::symlink("data/x.csv", dir.path().join("src/x.csv")).expect("link");
        dir
    }

    fn files() -> Vec<PathBuf> {
        ["train.py", "src/data/x.csv", "src/x.csv"]
            .iter()
            .map(PathBuf::from)
            .collect()
    }

    #[test]
    fn the_same_tree_makes_the_same_bundle_and_unpacks_as_it_was() {
        let a = tree();
        let one = make(a.path(), &files()).expect("bundle");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut reversed = files();
        reversed.reverse();
        let two = make(tree().path(), &reversed).expect("bundle");
        assert_eq!(hash(&one), hash(&two));
        let out = tempfile::tempdir().expect("tempdir");
        // A bundle that unpacks past the bounds is refused (a compression bomb).
        let err = unpack_within(&one, out.path(), 8, 100).expect_err("bytes");
        assert!(matches!(err, BundleError::TooLarge { .. }), "{err}");
        let out = tempfile::tempdir().expect("tempdir");
        assert!(
            unpack_within(&one, out.path(), 1 << 20, 2).is_err(),
            "entries"
        );
        let out = tempfile::tempdir().expect("tempdir");
        unpack(&one, out.path()).expect("unpack");
        let read = |p: &str| std::fs::read_to_string(out.path().join(p)).expect(p);
        assert_eq!(read("train.py"), "print('v1')\n");
        assert_eq!(read("src/x.csv"), "1,2\n");
        std::fs::write(a.path().join("train.py"), "print('v2')\n").expect("write");
        assert_ne!(hash(&make(a.path(), &files()).expect("bundle")), hash(&one));
    }

    #[test]
    fn a_file_that_shrinks_while_it_is_bundled_fails_the_bundle() {
        let mut short = Exact {
            inner: &b"abc"[..],
            left: 5,
        };
        let mut out = Vec::new();
        let err = std::io::copy(&mut short, &mut out).expect_err("short");
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    fn gz(raw: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(raw).expect("gz");
        gz.finish().expect("gz")
    }

    /// A size told by a PAX record counts, not the header's 0 beside it.
    #[test]
    fn a_size_a_pax_record_tells_counts_against_the_bound() {
        let record = |body: &str| {
            let mut n = body.len() + 2;
            while format!("{n}{body}").len() != n {
                n += 1;
            }
            format!("{n}{body}")
        };
        let pax = record(" size=10485760\n");
        let mut tar = tar::Builder::new(Vec::new());
        let mut x = tar::Header::new_ustar();
        x.set_entry_type(tar::EntryType::XHeader);
        x.set_size(pax.len() as u64);
        x.set_cksum();
        tar.append_data(&mut x, "PaxHeaders/big", pax.as_bytes())
            .expect("pax");
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(0);
        h.set_mode(0o644);
        tar.append_data(&mut h, "big", &b""[..]).expect("entry");
        let bomb = gz(&tar.into_inner().expect("tar"));
        let out = tempfile::tempdir().expect("tempdir");
        let err = unpack_within(&bomb, out.path(), 1 << 20, 100).expect_err("bound");
        assert!(matches!(err, BundleError::TooLarge { .. }), "{err}");
    }

    /// Modes are `make`'s, whatever the archive says: no set-id bit reaches the tree.
    #[test]
    fn no_set_id_bit_survives_unpacking() {
        use std::os::unix::fs::PermissionsExt;
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(2);
        h.set_mode(0o6755);
        tar.append_data(&mut h, "tool", &b"x\n"[..]).expect("entry");
        let out = tempfile::tempdir().expect("tempdir");
        unpack(&gz(&tar.into_inner().expect("tar")), out.path()).expect("unpack");
        let mode = std::fs::metadata(out.path().join("tool"))
            .expect("tool")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7000, 0, "{mode:o}");
    }

    #[test]
    fn a_link_out_of_the_tree_is_refused_both_ways() {
        let a = tree();
        std::os::unix::fs::symlink("../../etc/passwd", a.path().join("src/evil")).expect("link");
        let mut with = files();
        with.push("src/evil".into());
        let err = make(a.path(), &with).expect_err("refused");
        assert!(matches!(err, BundleError::LinkOutside { .. }), "{err}");
        assert!(!stays_inside(Path::new("a"), Path::new("/etc")));
        assert!(stays_inside(Path::new("a/b"), Path::new("../c")));
        assert!(!stays_inside(Path::new("a/b"), Path::new("../../c")));
        // A hand-made bundle with an escaping link is not unpacked.
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        tar.append_link(&mut h, "up", "../..").expect("link");
        let out = tempfile::tempdir().expect("tempdir");
        assert!(unpack(&gz(&tar.into_inner().expect("tar")), out.path()).is_err());
    }
}
