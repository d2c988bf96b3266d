//! The writer's fsync helpers: a few long-lived threads that fsync segment
//! files in parallel, so one fsync round over the five to eight segments a
//! batch touches takes about as long as the slowest file, not their sum.
//!
//! The threads live as long as the writer. Spawning them for every round
//! (what the writer did first) cost a thread creation and a join per
//! segment per batch, on the critical path of every acknowledgement.
//!
//! A round is started and waited for separately: the writer writes the
//! next batch while the helpers sync the one before.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crate::segment::Faults;

/// Called once when every file of a round is synced.
pub(crate) type OnDone = Arc<dyn Fn() + Send + Sync>;

/// One fsync asked of a helper, answered on `done` with its index.
struct Job {
    index: usize,
    file: Arc<File>,
    done: Sender<(usize, io::Result<()>)>,
    countdown: Countdown,
}

/// Files of a round not yet synced, plus one held by `start` until every
/// job is handed out; whoever takes it to zero calls `on_done`.
#[derive(Clone)]
struct Countdown {
    left: Arc<AtomicUsize>,
    on_done: OnDone,
}

impl Countdown {
    fn tick(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            (self.on_done)();
        }
    }
}

/// What each helper thread runs before it takes jobs.
pub(crate) type OnStart = Arc<dyn Fn() + Send + Sync>;

/// Long-lived fsync threads.
pub(crate) struct SyncPool {
    faults: Arc<Faults>,
    workers: Vec<Sender<Job>>,
    handles: Vec<JoinHandle<()>>,
}

impl SyncPool {
    /// Starts up to `helpers` threads (fewer if the system refuses more;
    /// with none, every fsync runs on the caller's thread); each runs
    /// `on_start` first, and this returns once all of them have, so what
    /// `on_start` reports (the real-time count) is complete.
    pub(crate) fn new(helpers: usize, faults: Arc<Faults>, on_start: OnStart) -> SyncPool {
        let mut workers = Vec::new();
        let mut handles = Vec::new();
        let (ready_tx, ready_rx) = channel::<()>();
        for i in 0..helpers {
            let (tx, rx) = channel::<Job>();
            let f = faults.clone();
            let start = on_start.clone();
            let ready = ready_tx.clone();
            match thread::Builder::new()
                .name(format!("melddb-log-fsync-{i}"))
                .spawn(move || {
                    start();
                    drop(start);
                    // The pool waits for this; a send cannot fail while it does.
                    let _ = ready.send(());
                    drop(ready);
                    work(&rx, &f)
                }) {
                Ok(h) => {
                    workers.push(tx);
                    handles.push(h);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not start an fsync helper thread; syncing on fewer");
                    break;
                }
            }
        }
        // Every started helper sends once (or drops its sender by dying),
        // so this ends.
        drop(ready_tx);
        while ready_rx.recv().is_ok() {}
        SyncPool {
            faults,
            workers,
            handles,
        }
    }

    /// Hands every file to the helpers and returns at once; the round's
    /// results come from [`Round::wait`], and `on_done` is called (on a
    /// helper, or here) once they are all in. Where there is no helper (or
    /// it is gone) the file is synced here, before returning.
    pub(crate) fn start(&self, files: &[Arc<File>], on_done: OnDone) -> Round {
        let mut results: Vec<Option<io::Result<()>>> = files.iter().map(|_| None).collect();
        let (done_tx, done_rx) = channel();
        let countdown = Countdown {
            left: Arc::new(AtomicUsize::new(files.len() + 1)),
            on_done,
        };
        let mut asked = 0usize;
        for (index, file) in files.iter().enumerate() {
            let job = Job {
                index,
                file: file.clone(),
                done: done_tx.clone(),
                countdown: countdown.clone(),
            };
            let sent = match self.workers.get(index % self.workers.len().max(1)) {
                Some(w) => w.send(job).map_err(|e| e.0),
                None => Err(job),
            };
            match sent {
                Ok(()) => asked += 1,
                Err(job) => {
                    results[job.index] = Some(self.faults.sync(&job.file));
                    countdown.tick();
                }
            }
        }
        countdown.tick();
        Round {
            results,
            asked,
            received: 0,
            done: done_rx,
        }
    }
}

/// An fsync round under way on the helpers.
pub(crate) struct Round {
    results: Vec<Option<io::Result<()>>>,
    asked: usize,
    /// Answers already taken by [`Round::is_done`].
    received: usize,
    done: Receiver<(usize, io::Result<()>)>,
}

impl Round {
    /// Whether every file of the round has been synced (or failed), without
    /// waiting. [`Round::wait`] then returns at once.
    pub(crate) fn is_done(&mut self) -> bool {
        while self.received < self.asked {
            match self.done.try_recv() {
                Ok((i, r)) => {
                    self.results[i] = Some(r);
                    self.received += 1;
                }
                Err(TryRecvError::Empty) => return false,
                // A helper stopped: `wait` reports it.
                Err(TryRecvError::Disconnected) => return true,
            }
        }
        true
    }

    /// Waits for every file of the round; results in the order given.
    pub(crate) fn wait(mut self) -> Vec<io::Result<()>> {
        for _ in self.received..self.asked {
            match self.done.recv() {
                Ok((i, r)) => self.results[i] = Some(r),
                Err(_) => break,
            }
        }
        self.results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(io::Error::other("an fsync helper thread stopped"))))
            .collect()
    }
}

fn work(rx: &Receiver<Job>, faults: &Faults) {
    for job in rx {
        // A send error means the writer stopped waiting: nobody to tell.
        let _ = job.done.send((job.index, faults.sync(&job.file)));
        job.countdown.tick();
    }
}

impl Drop for SyncPool {
    fn drop(&mut self) {
        self.workers.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_files(n: usize) -> (tempfile::TempDir, Vec<Arc<File>>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = (0..n)
            .map(|i| Arc::new(File::create(dir.path().join(format!("f{i}"))).expect("create")))
            .collect();
        (dir, files)
    }

    #[test]
    fn every_file_gets_a_result_in_order() {
        for helpers in [0, 1, 3, 8] {
            let pool = SyncPool::new(helpers, Arc::new(Faults::none()), Arc::new(|| {}));
            for n in [0, 1, 2, 5, 9] {
                let (_dir, files) = temp_files(n);
                let calls = Arc::new(AtomicUsize::new(0));
                let c = calls.clone();
                let on_done: OnDone = Arc::new(move || {
                    c.fetch_add(1, Ordering::SeqCst);
                });
                let r = pool.start(&files, on_done).wait();
                assert_eq!(r.len(), n, "{helpers} helpers, {n} files");
                assert!(r.iter().all(|r| r.is_ok()), "{helpers} helpers, {n} files");
                // The last helper calls back just after sending its result.
                let t = std::time::Instant::now();
                while calls.load(Ordering::SeqCst) == 0 && t.elapsed().as_secs() < 5 {
                    std::thread::yield_now();
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
                assert_eq!(
                    calls.load(Ordering::SeqCst),
                    1,
                    "{helpers} helpers, {n} files"
                );
            }
        }
    }

    #[test]
    fn an_injected_fsync_fault_reaches_every_result() {
        let faults = Arc::new(Faults::none());
        let pool = SyncPool::new(3, faults.clone(), Arc::new(|| {}));
        let (_dir, files) = temp_files(6);
        faults.fail_syncs(true);
        let r = pool.start(&files, Arc::new(|| {})).wait();
        assert_eq!(r.len(), 6);
        assert!(r.iter().all(|r| r.is_err()));
        faults.fail_syncs(false);
        assert!(pool
            .start(&files, Arc::new(|| {}))
            .wait()
            .iter()
            .all(|r| r.is_ok()));
    }
}
