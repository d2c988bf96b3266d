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
//!
//! A round can end in one device cache flush per device instead of one per
//! file ([`How::WriteBack`]): each `fdatasync` flushes the device's whole
//! cache, and a device serves flushes one after another, so a round over
//! eight files on one disk paid for eight. Files whose pages need no
//! metadata are only written back, in parallel; once all of the round's
//! files are done, one `fdatasync` per device (of one of its write-back
//! files) flushes its cache, which makes every write completed before it
//! durable. The helper that finished the last file issues that flush
//! itself (one of them, with several devices) rather than waking another.
//!
//! A small round can also run on the writer's own thread
//! ([`SyncPool::run_here`], `writer_round_max_bytes`): same steps, same
//! order, no wake-ups.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use crate::direct::DeferredWrite;
use crate::segment::{Faults, SegFile};

/// Called once when every file of a round is synced.
pub(crate) type OnDone = Arc<dyn Fn() + Send + Sync>;

/// How a file of a round is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// `fdatasync`: the data, the metadata needed to read it back, and a
    /// device cache flush.
    Sync,
    /// Written back only (`sync_file_range`); the round's flush of this
    /// device, issued once every file of the round is done, makes it
    /// durable. Only for pages written over blocks already allocated,
    /// written and committed, so there is no metadata to journal; the
    /// value identifies the device (`st_dev`).
    WriteBack(u64),
}

/// One file of a round, as the writer hands it over.
pub(crate) struct RoundFile {
    pub file: Arc<SegFile>,
    pub how: How,
    /// Held-back writes, done in order before the sync.
    pub writes: Vec<DeferredWrite>,
    /// Starts only once every other file is done (end-writes after the
    /// pages they describe).
    pub late: bool,
}

impl RoundFile {
    /// A file with nothing to write first and no wait.
    pub(crate) fn sync(file: Arc<SegFile>, how: How) -> RoundFile {
        RoundFile {
            file,
            how,
            writes: Vec::new(),
            late: false,
        }
    }
}

/// One file's sync (or a device's flush) asked of a helper, answered on
/// `done` with its index.
struct Job {
    index: usize,
    file: Arc<SegFile>,
    how: How,
    /// Held-back writes of the file's pages, done in order before the
    /// sync ([`crate::direct`]).
    writes: Vec<DeferredWrite>,
    done: Sender<(usize, io::Result<()>)>,
    countdown: Countdown,
}

/// Jobs of a stage not yet done, plus one held by whoever hands them out
/// until every job is handed out; whoever takes it to zero moves the round
/// on: it hands out the flushes, or calls `on_done`.
#[derive(Clone)]
struct Countdown {
    left: Arc<AtomicUsize>,
    then: Arc<Then>,
}

/// What follows a stage of a round.
enum Then {
    /// The round is over.
    Done(OnDone),
    /// The next stage's jobs, handed to the helpers too (in parallel;
    /// one of them runs on the helper that ended the stage): the late
    /// files (end-writes after their pages), or the flushes, one per
    /// device with write-back files.
    Stage {
        jobs: Mutex<Vec<Job>>,
        workers: Arc<[Sender<Job>]>,
        faults: Arc<Faults>,
        /// The stage's own countdown.
        after: Countdown,
    },
}

impl Countdown {
    fn new(jobs: usize, then: Then) -> Countdown {
        Countdown {
            left: Arc::new(AtomicUsize::new(jobs + 1)),
            then: Arc::new(then),
        }
    }

    fn tick(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        match &*self.then {
            Then::Done(on_done) => on_done(),
            Then::Stage {
                jobs,
                workers,
                faults,
                after,
            } => {
                let mut jobs = std::mem::take(&mut *crate::locks::lock(jobs));
                // On a helper, one job of the next stage runs here: this
                // thread is awake already, and handing that job to a
                // sleeping helper would put a wake-up (on a VM, an
                // interrupt between processors) on the round's critical
                // path, before its device flush.
                let here = if ON_HELPER.get() { jobs.pop() } else { None };
                hand_out(jobs, workers, faults);
                if let Some(job) = here {
                    job.finish(faults);
                }
                after.tick();
            }
        }
    }
}

/// Sends each job to a helper (round robin by index); one that cannot be
/// sent (no helper, or it is gone) runs here.
fn hand_out(jobs: Vec<Job>, workers: &[Sender<Job>], faults: &Faults) {
    for job in jobs {
        let sent = match workers.get(job.index % workers.len().max(1)) {
            Some(w) => w.send(job).map_err(|e| e.0),
            None => Err(job),
        };
        if let Err(job) = sent {
            job.finish(faults);
        }
    }
}

/// The flushes a round needs: for each device with write-back files (in
/// order of first appearance), the index of its first such file, which
/// the flush fsyncs.
fn flush_plan(hows: &[How]) -> Vec<(u64, usize)> {
    let mut plan: Vec<(u64, usize)> = Vec::new();
    for (i, h) in hows.iter().enumerate() {
        if let How::WriteBack(dev) = *h {
            if !plan.iter().any(|&(d, _)| d == dev) {
                plan.push((dev, i));
            }
        }
    }
    plan
}

/// Long-lived fsync threads.
pub(crate) struct SyncPool {
    faults: Arc<Faults>,
    /// Shared with the rounds under way (their flushes are handed out from
    /// a helper), so a round takes a reference, not a copy of the list.
    workers: Arc<[Sender<Job>]>,
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
            workers: workers.into(),
            handles,
        }
    }

    /// Hands every file to the helpers and returns at once; the round's
    /// results come from [`Round::wait`], and `on_done` is called (on a
    /// helper, or here) once they are all in, flushes included. Where
    /// there is no helper (or it is gone) the file is synced here, before
    /// returning.
    ///
    /// Each file's helper first does the file's held-back writes, in
    /// order; a file whose write fails is not synced, and its result is
    /// the write's error. Late files start only once every other file is
    /// done, writes and sync (end-writes wait for their stripes' pages).
    /// The device flushes come after every file, so they cover all writes.
    pub(crate) fn start(&self, files: Vec<RoundFile>, on_done: OnDone) -> Round {
        self.start_on(files, on_done, false)
    }

    /// Runs the whole round on the calling thread, in the order the
    /// helpers would keep (the files with their held-back writes, then
    /// the late ones, then one flush per device), and returns it done:
    /// [`Round::wait`] does not block and `on_done` has been called.
    /// For a small round on a thread that would only wait for it, this
    /// saves waking a helper per file and being woken at the end.
    pub(crate) fn run_here(&self, files: Vec<RoundFile>, on_done: OnDone) -> Round {
        self.start_on(files, on_done, true)
    }

    /// [`SyncPool::start`], or with `here` [`SyncPool::run_here`]: no
    /// helper is handed a job, so every job
    /// runs on this thread as it is handed out.
    fn start_on(&self, files: Vec<RoundFile>, on_done: OnDone, here: bool) -> Round {
        let workers: Arc<[Sender<Job>]> = if here {
            Arc::from([])
        } else {
            self.workers.clone()
        };
        let hows: Vec<How> = files.iter().map(|f| f.how).collect();
        let plan = flush_plan(&hows);
        let (done_tx, done_rx) = channel();
        // Built from the last stage back: each stage's countdown hands out
        // the next stage's jobs.
        let handing = |jobs: Vec<Job>, after: Countdown| Then::Stage {
            jobs: Mutex::new(jobs),
            workers: workers.clone(),
            faults: self.faults.clone(),
            after,
        };
        let mut then = Then::Done(on_done);
        if !plan.is_empty() {
            let after = Countdown::new(plan.len(), then);
            let jobs = plan
                .iter()
                .enumerate()
                .map(|(g, &(_, i))| Job {
                    index: files.len() + g,
                    file: files[i].file.clone(),
                    how: How::Sync,
                    writes: Vec::new(),
                    done: done_tx.clone(),
                    countdown: after.clone(),
                })
                .collect();
            then = handing(jobs, after);
        }
        let n = files.len();
        let job = |index: usize, f: RoundFile, countdown: &Countdown| Job {
            index,
            file: f.file,
            how: f.how,
            writes: f.writes,
            done: done_tx.clone(),
            countdown: countdown.clone(),
        };
        let (lates, firsts): (Vec<_>, Vec<_>) =
            files.into_iter().enumerate().partition(|(_, f)| f.late);
        if !lates.is_empty() {
            let after = Countdown::new(lates.len(), then);
            let jobs = lates.into_iter().map(|(i, f)| job(i, f, &after)).collect();
            then = handing(jobs, after);
        }
        let countdown = Countdown::new(firsts.len(), then);
        let jobs = firsts
            .into_iter()
            .map(|(i, f)| job(i, f, &countdown))
            .collect();
        hand_out(jobs, &workers, &self.faults);
        countdown.tick();
        Round {
            results: (0..n + plan.len()).map(|_| None).collect(),
            hows,
            flushes: plan.into_iter().map(|(dev, _)| dev).collect(),
            received: 0,
            done: done_rx,
            here,
        }
    }
}

/// An fsync round under way on the helpers.
pub(crate) struct Round {
    /// One per file, then one per flush; every job answers on `done`.
    results: Vec<Option<io::Result<()>>>,
    hows: Vec<How>,
    /// The device of each flush.
    flushes: Vec<u64>,
    /// Answers taken so far.
    received: usize,
    done: Receiver<(usize, io::Result<()>)>,
    /// Run on the caller's thread ([`SyncPool::run_here`]).
    here: bool,
}

impl Round {
    /// Whether the round ran on the thread that started it, and so is
    /// over.
    pub(crate) fn ran_here(&self) -> bool {
        self.here
    }

    /// Files the round writes back instead of fsyncing.
    pub(crate) fn write_backs(&self) -> u64 {
        self.hows
            .iter()
            .filter(|h| matches!(h, How::WriteBack(_)))
            .count() as u64
    }

    /// Device flushes that end the round (one per device with write-back
    /// files).
    pub(crate) fn flushes(&self) -> u64 {
        self.flushes.len() as u64
    }

    /// Whether every file of the round has been synced (or failed), without
    /// waiting. [`Round::wait`] then returns at once.
    pub(crate) fn is_done(&mut self) -> bool {
        while self.received < self.results.len() {
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

    /// Blocks until every file of the round is done (or a helper
    /// stopped), keeping the results for [`Round::wait`].
    pub(crate) fn wait_done(&mut self) {
        while self.received < self.results.len() {
            match self.done.recv() {
                Ok((i, r)) => {
                    self.results[i] = Some(r);
                    self.received += 1;
                }
                Err(_) => return,
            }
        }
    }

    /// Waits for every file of the round; one result per file, in the
    /// order given. A write-back file is durable only once its device's
    /// flush is, so a failed flush fails each of that device's write-back
    /// files.
    pub(crate) fn wait(mut self) -> Vec<io::Result<()>> {
        self.wait_done();
        let stopped = || io::Error::other("an fsync helper thread stopped");
        let mut results: Vec<io::Result<()>> = self
            .results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(stopped())))
            .collect();
        let flushed = results.split_off(self.hows.len());
        for (dev, r) in self.flushes.iter().zip(flushed) {
            let Err(e) = r else { continue };
            for (r, h) in results.iter_mut().zip(&self.hows) {
                if *h == How::WriteBack(*dev) && r.is_ok() {
                    *r = Err(io::Error::new(
                        e.kind(),
                        format!("the device cache flush that ends the round failed: {e}"),
                    ));
                }
            }
        }
        results
    }
}

impl Job {
    /// Runs the job and reports it: the result to the round, then the tick.
    fn finish(self, faults: &Faults) {
        let r = self
            .writes
            .iter()
            .try_for_each(|w| faults.write_deferred(w))
            .and_then(|()| match self.how {
                How::Sync => faults.sync(&self.file),
                How::WriteBack(_) => faults.write_back(&self.file),
            });
        // The buffers go back to the pool before the round is reported.
        drop(self.writes);
        // A send error means the writer stopped waiting: nobody to tell.
        let _ = self.done.send((self.index, r));
        self.countdown.tick();
    }
}

thread_local! {
    /// Whether this thread is one of the pool's helpers (a round's later
    /// stages may run on it; the writer's thread only hands out).
    static ON_HELPER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn work(rx: &Receiver<Job>, faults: &Faults) {
    ON_HELPER.set(true);
    for job in rx {
        job.finish(faults);
    }
}

impl Drop for SyncPool {
    fn drop(&mut self) {
        // The helpers stop once every sender is gone: this list's, and
        // those of rounds still under way when they end.
        self.workers = Arc::from([]);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests;
