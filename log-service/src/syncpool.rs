//! The writer's fsync helpers: a few long-lived threads that fsync segment
//! files in parallel, so one fsync round over the five to eight segments a
//! batch touches takes about as long as the slowest file, not their sum.
//!
//! The threads live as long as the writer. Spawning them for every round
//! (what the writer did first) cost a thread creation and a join per
//! segment per batch, on the critical path of every acknowledgement.

use std::fs::File;
use std::io;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crate::segment::Faults;

/// One fsync asked of a helper, answered on `done` with its index.
struct Job {
    index: usize,
    file: Arc<File>,
    done: Sender<(usize, io::Result<()>)>,
}

/// Long-lived fsync threads.
pub(crate) struct SyncPool {
    faults: Arc<Faults>,
    workers: Vec<Sender<Job>>,
    handles: Vec<JoinHandle<()>>,
}

impl SyncPool {
    /// Starts up to `helpers` threads (fewer if the system refuses more;
    /// with none, every fsync runs on the caller's thread).
    pub(crate) fn new(helpers: usize, faults: Arc<Faults>) -> SyncPool {
        let mut workers = Vec::new();
        let mut handles = Vec::new();
        for i in 0..helpers {
            let (tx, rx) = channel::<Job>();
            let f = faults.clone();
            match thread::Builder::new()
                .name(format!("melddb-log-fsync-{i}"))
                .spawn(move || work(&rx, &f))
            {
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
        SyncPool {
            faults,
            workers,
            handles,
        }
    }

    /// fsyncs every file, in parallel where there are helpers (the first
    /// one on the caller's thread), and returns each result in order.
    pub(crate) fn sync_all(&self, files: &[Arc<File>]) -> Vec<io::Result<()>> {
        let mut results: Vec<Option<io::Result<()>>> = files.iter().map(|_| None).collect();
        let (done_tx, done_rx) = channel();
        let mut asked = 0usize;
        for (index, file) in files.iter().enumerate().skip(1) {
            let job = Job {
                index,
                file: file.clone(),
                done: done_tx.clone(),
            };
            let sent = match self.workers.get((index - 1) % self.workers.len().max(1)) {
                Some(w) => w.send(job).map_err(|e| e.0),
                None => Err(job),
            };
            match sent {
                Ok(()) => asked += 1,
                // No helper (or it is gone): sync here.
                Err(job) => results[job.index] = Some(self.faults.sync(&job.file)),
            }
        }
        drop(done_tx);
        if let Some(first) = files.first() {
            results[0] = Some(self.faults.sync(first));
        }
        for _ in 0..asked {
            match done_rx.recv() {
                Ok((i, r)) => results[i] = Some(r),
                Err(_) => break,
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(io::Error::other("an fsync helper thread stopped"))))
            .collect()
    }
}

fn work(rx: &Receiver<Job>, faults: &Faults) {
    for job in rx {
        // A send error means the writer stopped waiting: nobody to tell.
        let _ = job.done.send((job.index, faults.sync(&job.file)));
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
            let pool = SyncPool::new(helpers, Arc::new(Faults::none()));
            for n in [0, 1, 2, 5, 9] {
                let (_dir, files) = temp_files(n);
                let r = pool.sync_all(&files);
                assert_eq!(r.len(), n, "{helpers} helpers, {n} files");
                assert!(r.iter().all(|r| r.is_ok()), "{helpers} helpers, {n} files");
            }
        }
    }

    #[test]
    fn an_injected_fsync_fault_reaches_every_result() {
        let faults = Arc::new(Faults::none());
        let pool = SyncPool::new(3, faults.clone());
        let (_dir, files) = temp_files(6);
        faults.fail_syncs(true);
        let r = pool.sync_all(&files);
        assert_eq!(r.len(), 6);
        assert!(r.iter().all(|r| r.is_err()));
        faults.fail_syncs(false);
        assert!(pool.sync_all(&files).iter().all(|r| r.is_ok()));
    }
}
