//! Rounds run through `io_uring` on one thread (Linux, with
//! `direct_every_block`).
//!
//! With every block written directly, a round is the device's work only:
//! the page files' writes, then the end-write files' (after the pages they
//! describe), then one flush per device. On the helper threads
//! ([`crate::syncpool`]) each file's write is a blocking call on its own
//! thread, so a round wakes five to eight threads, and each stage waits
//! for the slowest wake-up as well as the slowest write. Here one thread
//! queues every file's next operation at once and takes the completions
//! as they come. On the two-processor benchmark VM at 150K appends/s of
//! 1 KiB, two alternating pairs of runs put the round's median at 0.61
//! and 0.61 ms on the helpers against 0.51 and 0.61 ms here, with less
//! CPU (docs/benchmarks.md, thirty-sixth session).
//!
//! What a round does is the same as on the helpers: each file's writes in
//! order, then its sync (`fdatasync`, or a write-back whose durability the
//! device's flush gives); the late files only once every other file is
//! done; the flushes last; one result per file and per flush, and
//! `on_done` once they are all in. Only stores opened without a fault
//! injector run here: the injector's writes and syncs are the helpers'.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use io_uring::{opcode, types, IoUring};

use crate::direct::DeferredWrite;
use crate::seg_file::SegFile;
use crate::syncpool::{How, OnDone, OnStart};

/// Operations in flight at once: one per file of a stage. A stage with
/// more files starts the rest as slots free up.
const RING_ENTRIES: u32 = 32;

/// One file of a stage.
pub(crate) struct FileWork {
    /// Its index in the round's results.
    pub index: usize,
    pub file: Arc<SegFile>,
    pub how: How,
    /// Held-back writes, done in order before the sync.
    pub writes: Vec<DeferredWrite>,
}

/// A round: its stages in order (each starts once the one before is
/// done), where the results go, and what to call at the end.
pub(crate) struct Work {
    pub stages: Vec<Vec<FileWork>>,
    pub done: Sender<(usize, io::Result<()>)>,
    pub on_done: OnDone,
}

/// The thread that runs rounds through its ring.
pub(crate) struct Uring {
    tx: Option<Sender<Work>>,
    handle: Option<JoinHandle<()>>,
}

impl Uring {
    /// Starts the thread with its ring (after `on_start`); `Err` when the
    /// kernel offers no `io_uring` (then the helpers run every round).
    pub(crate) fn start(on_start: OnStart) -> io::Result<Uring> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let (tx, rx) = channel::<Work>();
        let handle = thread::Builder::new()
            .name("melddb-log-uring".into())
            .spawn(move || {
                on_start();
                let mut ring = ring;
                for work in rx {
                    run(&mut ring, work);
                }
            })?;
        Ok(Uring {
            tx: Some(tx),
            handle: Some(handle),
        })
    }

    /// Ends the thread as if it had died (tests of the way back to the
    /// helpers).
    #[cfg(test)]
    pub(crate) fn stop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }

    /// Hands a round to the thread; gives it back if the thread is gone.
    pub(crate) fn send(&self, work: Work) -> Result<(), Work> {
        match &self.tx {
            Some(tx) => tx.send(work).map_err(|e| e.0),
            None => Err(work),
        }
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Runs every stage of a round, reports each result, then ends it.
fn run(ring: &mut IoUring, work: Work) {
    for stage in work.stages {
        for (index, result) in run_stage(ring, stage) {
            // A send error means the writer stopped waiting.
            let _ = work.done.send((index, result));
        }
    }
    (work.on_done)();
}

/// One operation of a file: a write of `len` bytes from `ptr` at absolute
/// offset `at` of `fd` (with the descriptor to fall back on if a direct
/// write is refused for its alignment), or the file's sync.
#[derive(Clone, Copy)]
enum Op {
    Write {
        fd: i32,
        fallback: Option<i32>,
        ptr: *const u8,
        len: usize,
        at: u64,
    },
    /// `fdatasync`.
    SyncData { fd: i32 },
    /// Written back (done on this thread, see [`ops`]).
    WriteBack,
}

/// The operations of one file, in order. Pointers are into `w.writes`,
/// which the caller keeps alive (and unmoved: the buffers are heap
/// allocations that are not touched) until every operation is complete.
fn ops(w: &FileWork) -> io::Result<Vec<Op>> {
    let mut v = Vec::new();
    let buffered = w.file.file().as_raw_fd();
    for d in &w.writes {
        let mid = d.middle();
        let parts = [
            (&d.head[..], None),
            (mid, d.direct.as_ref().filter(|_| !mid.is_empty())),
            (&d.tail[..], None),
        ];
        let mut off = d.off;
        for (bytes, direct) in parts {
            if !bytes.is_empty() {
                let at = w.file.locate(off, bytes.len())?;
                let (fd, fallback) = match direct {
                    Some(f) => (f.file().as_raw_fd(), Some(buffered)),
                    None => (buffered, None),
                };
                v.push(Op::Write {
                    fd,
                    fallback,
                    ptr: bytes.as_ptr(),
                    len: bytes.len(),
                    at,
                });
            }
            off += bytes.len() as u64;
        }
    }
    v.push(match w.how {
        How::Sync => Op::SyncData { fd: buffered },
        // With every block written directly there is nothing in the page
        // cache to write back but a fallback's bytes, so this is a quick
        // call on this thread; the device flush that makes it durable is
        // the round's last stage.
        How::WriteBack(_) => Op::WriteBack,
    });
    Ok(v)
}

/// Times in a row one operation may come back interrupted or "try
/// again" before the file's result is that error: the kernel retries
/// such writes itself, so a run this long means something is wrong, and
/// the round must end rather than spin.
const MAX_RETRIES: u32 = 1000;

/// A file's progress through its operations.
struct Progress {
    ops: Vec<Op>,
    next: usize,
    result: Option<io::Result<()>>,
    /// Retries of the current operation in a row ([`MAX_RETRIES`]).
    retries: u32,
}

/// Runs a stage: every file's operations in order, files side by side.
fn run_stage(ring: &mut IoUring, stage: Vec<FileWork>) -> Vec<(usize, io::Result<()>)> {
    let mut files: Vec<Progress> = stage
        .iter()
        .map(|w| match ops(w) {
            Ok(ops) => Progress {
                ops,
                next: 0,
                result: None,
                retries: 0,
            },
            Err(e) => Progress {
                ops: Vec::new(),
                next: 0,
                result: Some(Err(e)),
                retries: 0,
            },
        })
        .collect();
    let alone = stage.len() == 1;
    let mut in_flight = 0usize;
    let mut unstarted = 0usize;
    let mut broken: Option<io::Error> = None;
    loop {
        // Start files while there are free slots; a file whose next
        // operation is done here (a write-back) moves on at once.
        while broken.is_none() && in_flight < RING_ENTRIES as usize && unstarted < files.len() {
            let i = unstarted;
            unstarted += 1;
            match advance(ring, &stage[i], &mut files[i], i, alone) {
                Ok(true) => in_flight += 1,
                Ok(false) => {}
                Err(e) => broken = Some(e),
            }
        }
        if in_flight == 0 {
            break;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // The ring itself failed: what is in flight is unknown, so
            // its buffers must outlive this stage (below).
            broken = Some(e);
            break;
        }
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (i, res) in done {
            let i = i as usize;
            let Some(p) = files.get_mut(i) else { continue };
            in_flight -= 1;
            if let Some(again) = complete(p, res) {
                p.ops[p.next] = again;
            }
            if p.result.is_some() || broken.is_some() {
                continue;
            }
            match advance(ring, &stage[i], p, i, alone) {
                Ok(true) => in_flight += 1,
                Ok(false) => {}
                Err(e) => broken = Some(e),
            }
        }
        if broken.is_some() && in_flight == 0 {
            break;
        }
    }
    if let Some(e) = &broken {
        if in_flight > 0 {
            // Operations may still be reading these buffers: keep them
            // for good rather than free memory the kernel may read.
            tracing::error!(error = %e, "io_uring failed with writes in flight; their buffers are kept");
            let indices: Vec<usize> = stage.iter().map(|w| w.index).collect();
            std::mem::forget(stage);
            return indices
                .into_iter()
                .map(|index| (index, Err(io::Error::new(e.kind(), e.to_string()))))
                .collect();
        }
    }
    stage
        .iter()
        .zip(files)
        .map(|(w, p)| {
            let r = match (p.result, &broken) {
                (Some(r), _) => r,
                (None, Some(e)) => Err(io::Error::new(e.kind(), e.to_string())),
                (None, None) => Err(io::Error::other("a round's operation was left undone")),
            };
            (w.index, r)
        })
        .collect()
}

/// Queues file `i`'s next operation (`Ok(true)`), doing write-backs (and
/// the sync of a file `alone` in its stage) here on the way; `Ok(false)`
/// when the file is done (its result set). `Err` only when the ring
/// refuses the entry.
fn advance(
    ring: &mut IoUring,
    w: &FileWork,
    p: &mut Progress,
    i: usize,
    alone: bool,
) -> io::Result<bool> {
    loop {
        let Some(&op) = p.ops.get(p.next) else {
            p.result = Some(Ok(()));
            return Ok(false);
        };
        let entry = match op {
            Op::WriteBack => {
                if let Err(e) = w.file.write_back() {
                    p.result = Some(Err(e));
                    return Ok(false);
                }
                p.next += 1;
                continue;
            }
            // Alone in its stage (the device flush that ends a round),
            // the sync is done here: through the ring it would go to a
            // kernel worker thread, which measured about 0.2 ms more per
            // round at 150K appends/s.
            Op::SyncData { .. } if alone => {
                if let Err(e) = w.file.sync_data() {
                    p.result = Some(Err(e));
                    return Ok(false);
                }
                p.next += 1;
                continue;
            }
            Op::SyncData { fd } => opcode::Fsync::new(types::Fd(fd))
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Op::Write {
                fd, ptr, len, at, ..
            } => {
                // A write longer than one entry takes (the whole blocks a
                // `u32` holds) is finished by the short-write path in
                // `complete`.
                let n = u32::try_from(len).unwrap_or(!(crate::direct::BLOCK as u32 - 1));
                opcode::Write::new(types::Fd(fd), ptr, n).offset(at).build()
            }
        };
        // SAFETY: the entry's buffer is part of a `FileWork` of the stage,
        // which `run_stage` keeps (or leaks) until every queued operation
        // has completed, and its descriptors are the files' own, open for
        // as long; the ring copies the entry itself.
        unsafe { ring.submission().push(&entry.user_data(i as u64)) }
            .map_err(|_| io::Error::other("the io_uring submission queue is full"))?;
        return Ok(true);
    }
}

/// Takes the completion `res` of file `p`'s current operation: moves it
/// on, records its failure, or returns the operation to queue again (the
/// rest of a short write, a retry after an interruption, or a direct
/// write refused for its alignment, on the buffered descriptor).
fn complete(p: &mut Progress, res: i32) -> Option<Op> {
    let op = *p.ops.get(p.next)?;
    if res < 0 {
        let errno = -res;
        return match op {
            _ if (errno == libc::EINTR || errno == libc::EAGAIN) && p.retries < MAX_RETRIES => {
                p.retries += 1;
                Some(op)
            }
            Op::Write {
                fallback: Some(fd),
                ptr,
                len,
                at,
                ..
            } if errno == libc::EINVAL => Some(Op::Write {
                fd,
                fallback: None,
                ptr,
                len,
                at,
            }),
            _ => {
                p.result = Some(Err(io::Error::from_raw_os_error(errno)));
                None
            }
        };
    }
    if let Op::Write {
        fd,
        fallback,
        ptr,
        len,
        at,
    } = op
    {
        let n = res as usize;
        if n == 0 && len > 0 {
            p.result = Some(Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "a segment write wrote nothing",
            )));
            return None;
        }
        if n < len {
            p.retries = 0;
            return Some(Op::Write {
                fd,
                fallback,
                // SAFETY: `n < len`, so this stays inside the buffer.
                ptr: unsafe { ptr.add(n) },
                len: len - n,
                at: at + n as u64,
            });
        }
    }
    p.next += 1;
    p.retries = 0;
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::direct::BufPool;

    /// A ring thread, or `None` (and a note) where the kernel has none.
    fn ring() -> Option<Uring> {
        Uring::start(Arc::new(|| {}))
            .inspect_err(|e| eprintln!("no io_uring here ({e}); skipped"))
            .ok()
    }

    /// Runs one round of `stages` and returns every file's answer in the
    /// order they came, checking that the round's end came after them all.
    fn run_round(uring: &Uring, stages: Vec<Vec<FileWork>>) -> Vec<(usize, io::Result<()>)> {
        let files: usize = stages.iter().map(Vec::len).sum();
        let (done, answers) = channel();
        let end = done.clone();
        uring
            .send(Work {
                stages,
                done,
                on_done: Arc::new(move || {
                    let _ = end.send((usize::MAX, Ok(())));
                }),
            })
            .map_err(|_| "the ring thread is gone")
            .expect("send");
        let mut got: Vec<(usize, io::Result<()>)> = (0..=files)
            .map(|_| answers.recv().expect("an answer"))
            .collect();
        assert_eq!(got.pop().map(|g| g.0), Some(usize::MAX), "ends last");
        got
    }

    /// How a completion moves a file on: a short write queues its rest,
    /// an `EINVAL` from a direct write queues the same bytes on the
    /// buffered descriptor (once: a second `EINVAL` is the result), an
    /// interruption queues the operation again but not forever, and any
    /// other error ends the file with it.
    #[test]
    fn completions_resume_short_writes_fall_back_once_and_stop_retrying() {
        let buf = [0u8; 8192];
        let write = Op::Write {
            fd: 7,
            fallback: Some(3),
            ptr: buf.as_ptr(),
            len: 8192,
            at: 4096,
        };
        let progress = |op| Progress {
            ops: vec![op, Op::WriteBack],
            next: 0,
            result: None,
            retries: 0,
        };
        let mut p = progress(write);
        match complete(&mut p, 4096) {
            Some(Op::Write {
                fd: 7,
                ptr,
                len: 4096,
                at: 8192,
                ..
            }) => assert_eq!(ptr, buf[4096..].as_ptr()),
            _ => panic!("the rest of a short write"),
        }
        assert_eq!((p.next, p.result.is_none()), (0, true));
        assert!(complete(&mut p, 8192).is_none());
        assert_eq!(p.next, 1, "a whole write moves on");

        let mut p = progress(write);
        let again = complete(&mut p, -libc::EINVAL);
        assert!(matches!(
            again,
            Some(Op::Write {
                fd: 3,
                fallback: None,
                ..
            })
        ));
        p.ops[0] = again.unwrap();
        assert!(complete(&mut p, -libc::EINVAL).is_none());
        let e = p.result.take().unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));

        let mut p = progress(write);
        for _ in 0..MAX_RETRIES {
            assert!(complete(&mut p, -libc::EAGAIN).is_some());
        }
        assert!(complete(&mut p, -libc::EAGAIN).is_none());
        let e = p.result.take().unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));

        // Retries count in a row: progress starts the count again.
        let mut p = progress(write);
        for _ in 0..MAX_RETRIES {
            assert!(complete(&mut p, -libc::EINTR).is_some());
        }
        assert!(complete(&mut p, 4096).is_some());
        assert!(complete(&mut p, -libc::EINTR).is_some());
        assert!(p.result.is_none());

        // A write that wrote nothing ends its file rather than spin.
        let mut p = progress(write);
        assert!(complete(&mut p, 0).is_none());
        let e = p.result.take().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);

        let mut p = progress(Op::SyncData { fd: 3 });
        assert!(complete(&mut p, -libc::EIO).is_none());
        let e = p.result.take().unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }

    /// A stage of more files than the ring has entries starts the rest as
    /// slots free up, and a split write's middle goes through the file's
    /// direct descriptor: where that descriptor is read-only the file
    /// fails with its error (nothing else would refuse it), where it is
    /// writable the file holds every byte, synced or written back.
    #[test]
    fn a_stage_wider_than_the_ring_runs_every_file_and_middles_go_direct() {
        let Some(uring) = ring() else { return };
        const B: usize = crate::direct::BLOCK as usize;
        let n = RING_ENTRIES as usize + 8;
        let dir = tempfile::tempdir().expect("temp dir");
        let pool = BufPool::default();
        let path = |i: usize| dir.path().join(format!("f{i}"));
        let buf = |i: usize| -> Vec<u8> { (0..4 * B).map(|k| (k % 251 + i) as u8).collect() };
        let stage: Vec<FileWork> = (0..n)
            .map(|i| {
                let file = Arc::new(crate::segment::open(&path(i), true).expect("create"));
                // Odd files get a read-only second descriptor.
                let second = std::fs::OpenOptions::new()
                    .read(true)
                    .write(i % 2 == 0)
                    .open(path(i))
                    .expect("second descriptor");
                let w = DeferredWrite::new(
                    file.clone(),
                    Some(Arc::new(SegFile::whole(second))),
                    (B / 2) as u64,
                    &buf(i),
                    &pool,
                );
                assert_eq!(w.middle().len(), 3 * B);
                FileWork {
                    index: i,
                    file,
                    // Every fourth file written back only, the round's
                    // device flush (not part of this stage) to follow.
                    how: if i % 4 == 0 {
                        How::WriteBack(0)
                    } else {
                        How::Sync
                    },
                    writes: vec![w],
                }
            })
            .collect();
        let mut got = run_round(&uring, vec![stage]);
        got.sort_by_key(|g| g.0);
        assert_eq!(got.len(), n);
        for (i, r) in got {
            if i % 2 == 0 {
                r.unwrap_or_else(|e| panic!("file {i}: {e}"));
                let bytes = std::fs::read(path(i)).expect("read");
                assert_eq!(&bytes[B / 2..], &buf(i)[..], "file {i}");
            } else {
                let e = r.expect_err("the read-only descriptor's refusal");
                assert_eq!(e.raw_os_error(), Some(libc::EBADF), "file {i}: {e}");
            }
        }
    }

    /// A round through the ring: each file's writes land in order (the
    /// second overwrites part of the first), a whole-block write goes
    /// through the direct descriptor where the file system takes one,
    /// every file and flush answers at its own index, a file whose
    /// descriptor refuses writes fails alone, and the round ends once,
    /// after every answer.
    #[test]
    fn a_round_writes_each_file_in_order_and_answers_every_index_before_it_ends() {
        let Some(uring) = ring() else { return };
        let dir = tempfile::tempdir().expect("temp dir");
        let pool = BufPool::default();
        let path = |i: usize| dir.path().join(format!("f{i}"));
        let files: Vec<Arc<SegFile>> = (0..3)
            .map(|i| Arc::new(crate::segment::open(&path(i), true).expect("create")))
            .collect();
        std::fs::write(path(3), b"").expect("create");
        let read_only = Arc::new(SegFile::whole(std::fs::File::open(path(3)).expect("open")));
        let two_writes = |f: &Arc<SegFile>, a: u8, b: u8| {
            vec![
                DeferredWrite::new(f.clone(), None, 0, &[a; 5000], &pool),
                DeferredWrite::new(f.clone(), None, 2000, &[b; 3000], &pool),
            ]
        };
        let direct = files[1].open_direct();
        let whole_len = if direct.is_ok() { 8192 } else { 6000 };
        let whole = match direct {
            Ok(d) => vec![DeferredWrite::whole_blocks(
                files[1].clone(),
                Arc::new(d),
                0,
                &[],
                &[7; 6000],
                &pool,
            )],
            Err(_) => vec![DeferredWrite::new(
                files[1].clone(),
                None,
                0,
                &[7; 6000],
                &pool,
            )],
        };
        let work = |index: usize, file: &Arc<SegFile>, writes| FileWork {
            index,
            file: file.clone(),
            how: How::Sync,
            writes,
        };
        let got = run_round(
            &uring,
            vec![
                vec![
                    work(0, &files[0], two_writes(&files[0], 1, 2)),
                    work(1, &files[1], whole),
                    work(3, &read_only, two_writes(&read_only, 5, 6)),
                ],
                vec![work(2, &files[2], two_writes(&files[2], 3, 4))],
                vec![work(4, &files[0], Vec::new())],
            ],
        );
        let mut by_index: Vec<(usize, bool)> = got.iter().map(|(i, r)| (*i, r.is_ok())).collect();
        by_index.sort();
        assert_eq!(
            by_index,
            vec![(0, true), (1, true), (2, true), (3, false), (4, true)]
        );
        for (i, (a, b)) in [(0, (1u8, 2u8)), (2, (3, 4))] {
            let bytes = std::fs::read(path(i)).expect("read");
            assert_eq!(bytes.len(), 5000);
            assert!(bytes[..2000].iter().all(|&x| x == a), "file {i}");
            assert!(bytes[2000..].iter().all(|&x| x == b), "file {i}");
        }
        let bytes = std::fs::read(path(1)).expect("read");
        // Directly: whole blocks, zeros after the data.
        assert_eq!(bytes.len(), whole_len);
        assert!(bytes[..6000].iter().all(|&x| x == 7));
        assert!(bytes[6000..].iter().all(|&x| x == 0));
    }
}
