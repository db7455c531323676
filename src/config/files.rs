//! Reading the files rota's settings name: the config file, the policy file, TLS
//! certificates and keys, token files.
//!
//! Only a regular file is read (a symbolic link to one is followed), at most
//! [`MAX_FILE_BYTES`] of it, and opening never waits: a FIFO, a device or a directory is
//! refused with a message naming what it is. A reloader that runs while rota serves reads
//! through [`OffRuntime`], on a thread of its own with a deadline, so a file system that hangs
//! stalls neither the runtime nor shutdown.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

/// The largest settings file rota reads: far above any real one, small enough that a wrong
/// path (a log, a disk image) is refused instead of read into memory.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// How long a reloader waits for one look at its files before it gives up on that look.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads a regular file of at most [`MAX_FILE_BYTES`].
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let file = open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

/// [`read`], as UTF-8 text.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

/// The modification time and length of a regular file, `None` when it is missing or not
/// one: what the reloaders compare to notice a change.
pub fn modified(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    meta.is_file().then_some(())?;
    Some((meta.modified().ok()?, meta.len()))
}

fn open(path: &Path) -> io::Result<File> {
    // Checked before opening, since opening a FIFO for reading waits for a writer, and again
    // on the open file, which may have been replaced in between.
    check(&std::fs::metadata(path)?)?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    check(&file.metadata()?)?;
    Ok(file)
}

fn check(meta: &Metadata) -> io::Result<()> {
    if meta.is_file() {
        return if meta.len() > MAX_FILE_BYTES { Err(too_large()) } else { Ok(()) };
    }
    let kind = if meta.is_dir() { "a directory" } else { special_kind(meta) };
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("is {kind}, not a regular file")))
}

#[cfg(unix)]
fn special_kind(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_meta: &Metadata) -> &'static str {
    "a special file"
}

fn too_large() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("is larger than {} MiB", MAX_FILE_BYTES >> 20))
}

/// Why an [`OffRuntime`] look produced nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stalled {
    /// This look did not finish within its deadline; its thread is left to finish alone.
    #[error("reading did not finish within {0:?}")]
    TimedOut(Duration),
    /// An earlier look has still not finished, so no new one was started.
    #[error("an earlier read has still not finished")]
    Busy,
}

/// Runs a reloader's blocking file work on a thread of its own, one look at a time, and
/// waits for it at most a deadline. A look that hangs keeps its thread, never a runtime
/// worker, and no further look starts until it returns, so a hung file system costs one
/// thread however long it hangs.
#[derive(Debug, Clone, Default)]
pub struct OffRuntime {
    busy: Arc<AtomicBool>,
}

impl OffRuntime {
    /// Runs `work` off the runtime; its answer, or why there is none.
    pub async fn run<T: Send + 'static>(
        &self,
        deadline: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Stalled> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(Stalled::Busy);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let busy = self.busy.clone();
        let spawned = std::thread::Builder::new().name("rota-file-read".into()).spawn(move || {
            let answer = work();
            busy.store(false, Ordering::Release);
            let _ = tx.send(answer);
        });
        if spawned.is_err() {
            // No thread to be had: nothing runs, so nothing is busy.
            self.busy.store(false, Ordering::Release);
            return Err(Stalled::Busy);
        }
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) | Err(_) => Err(Stalled::TimedOut(deadline)),
        }
    }
}

impl OffRuntime {
    /// One look of a reloader at its files, off the runtime within [`READ_TIMEOUT`]: `seen`
    /// reads what tells a change (modification times), and when it differs from `last` (or
    /// the look is `forced`) `load` reads the files. `last` follows what was seen. `None` when
    /// nothing changed, or an earlier look is still running (its timeout was reported then);
    /// `Some(Err)` when this look timed out.
    pub async fn look<S, T>(
        &self,
        last: &mut S,
        forced: bool,
        seen: impl FnOnce() -> S + Send + 'static,
        load: impl FnOnce() -> T + Send + 'static,
    ) -> Option<Result<T, Stalled>>
    where
        S: PartialEq + Clone + Send + 'static,
        T: Send + 'static,
    {
        let before = last.clone();
        let look = self
            .run(READ_TIMEOUT, move || {
                let now = seen();
                let changed = forced || now != before;
                (now, changed.then(load))
            })
            .await;
        match look {
            Ok((now, loaded)) => {
                *last = now;
                loaded.map(Ok)
            }
            Err(Stalled::Busy) => None,
            Err(stalled @ Stalled::TimedOut(_)) => Some(Err(stalled)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempdir::Dir {
        tempdir::Dir::new()
    }

    mod tempdir {
        /// A directory removed when dropped.
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let path =
                    std::env::temp_dir().join(format!("rota-files-{}-{}", std::process::id(), fastrand::u64(..)));
                std::fs::create_dir_all(&path).unwrap();
                Self(path)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn a_regular_file_is_read_whole() {
        let dir = dir();
        let path = dir.0.join("a.toml");
        std::fs::write(&path, "x = 1\n").unwrap();
        assert_eq!(read_to_string(&path).unwrap(), "x = 1\n");
        assert_eq!(modified(&path).map(|(_, len)| len), Some(6));
    }

    #[test]
    fn a_directory_is_refused_by_name() {
        let dir = dir();
        let error = read(&dir.0).unwrap_err();
        assert_eq!(error.to_string(), "is a directory, not a regular file");
        assert_eq!(modified(&dir.0), None);
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = dir();
        let path = dir.0.join("fifo");
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // With no writer, opening it for reading would wait forever: this returns at once.
        let error = read(&path).unwrap_err();
        assert_eq!(error.to_string(), "is a FIFO, not a regular file");
        assert_eq!(modified(&path), None);
    }

    #[test]
    fn a_file_over_the_limit_is_refused() {
        let dir = dir();
        let path = dir.0.join("big");
        let file = File::create(&path).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        assert_eq!(read(&path).unwrap_err().to_string(), "is larger than 16 MiB");
    }

    #[tokio::test(start_paused = true)]
    async fn a_look_that_hangs_times_out_and_no_second_one_starts_until_it_ends() {
        let off = OffRuntime::default();
        let (release, hung) = std::sync::mpsc::channel::<()>();
        let first = off.run(READ_TIMEOUT, move || hung.recv().is_ok()).await;
        assert_eq!(first, Err(Stalled::TimedOut(READ_TIMEOUT)));
        assert_eq!(off.run(READ_TIMEOUT, || true).await, Err(Stalled::Busy));
        release.send(()).unwrap();
        // The hung look returns on its own thread, and then no look is under way.
        while off.busy.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    // On the real clock: a paused one would jump past the deadline while the look's thread runs.
    #[tokio::test]
    async fn a_look_that_answers_gives_its_answer_and_frees_the_next() {
        let off = OffRuntime::default();
        assert_eq!(off.run(READ_TIMEOUT, || 7).await, Ok(7));
        assert_eq!(off.run(READ_TIMEOUT, || 8).await, Ok(8));
    }
}
