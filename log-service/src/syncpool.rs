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
mod tests {
    use super::*;

    fn temp_files(n: usize) -> (tempfile::TempDir, Vec<Arc<SegFile>>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = (0..n)
            .map(|i| {
                let f = std::fs::File::create(dir.path().join(format!("f{i}"))).expect("create");
                Arc::new(SegFile::whole(f))
            })
            .collect();
        (dir, files)
    }

    fn synced(files: &[Arc<SegFile>]) -> Vec<(Arc<SegFile>, How)> {
        files.iter().map(|f| (f.clone(), How::Sync)).collect()
    }

    /// The round of `files`, each synced as given.
    fn round_of(files: &[(Arc<SegFile>, How)]) -> Vec<RoundFile> {
        files
            .iter()
            .map(|(f, how)| RoundFile::sync(f.clone(), *how))
            .collect()
    }

    /// A pool of `helpers` threads whose syncs go through a fault
    /// injector that records them (read with [`trace_of`]).
    fn traced_pool(helpers: usize) -> (Arc<Faults>, SyncPool) {
        let faults = Arc::new(Faults::none());
        let pool = SyncPool::new(helpers, faults.clone());
        (faults, pool)
    }

    /// The fault injector's trace so far.
    fn trace_of(faults: &Faults) -> Vec<(&'static str, u64, String)> {
        crate::locks::lock(&faults.trace).clone()
    }

    fn ino(f: &SegFile) -> u64 {
        use std::os::unix::fs::MetadataExt;
        f.file().metadata().expect("metadata").ino()
    }

    /// On the helpers, the held-back writes land in each file's order,
    /// the late file after the others, and every file answers.
    #[test]
    fn held_back_writes_land_in_order_and_the_late_file_last() {
        let (faults, pool) = traced_pool(3);
        let bufs = crate::direct::BufPool::default();
        let (dir, files) = temp_files(3);
        let round = |tag: u8| -> Vec<RoundFile> {
            files
                .iter()
                .enumerate()
                .map(|(i, f)| RoundFile {
                    file: f.clone(),
                    how: How::Sync,
                    writes: vec![
                        DeferredWrite::new(f.clone(), None, 0, &[tag; 3000], &bufs),
                        DeferredWrite::new(f.clone(), None, 1000, &[tag + 1; 1000], &bufs),
                    ],
                    late: i == 2,
                })
                .collect()
        };
        let check = |tag: u8| {
            for i in 0..3 {
                let got = std::fs::read(dir.path().join(format!("f{i}"))).expect("read");
                assert_eq!(got.len(), 3000);
                assert!(got[..1000].iter().all(|&b| b == tag));
                assert!(got[1000..2000].iter().all(|&b| b == tag + 1));
                assert!(got[2000..].iter().all(|&b| b == tag));
            }
        };
        // Slow syncs: a late file started with the others (a helper
        // each) would be written while they sync.
        faults.slow_syncs(std::time::Duration::from_millis(20));
        let r = pool.start(round(5), Arc::new(|| {})).wait();
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        check(5);
        let trace = trace_of(&faults);
        let ops = |what: &str| trace.iter().filter(|t| t.0 == what).count();
        assert_eq!(
            (ops("deferred-write"), ops("fsync"), trace.len()),
            (6, 3, 9),
            "the helpers wrote and synced every file: {trace:?}"
        );
        assert!(
            trace[6..].iter().all(|t| t.1 == ino(&files[2])),
            "the late file after the others: {trace:?}"
        );
    }

    #[test]
    fn the_plan_flushes_each_device_once_through_its_first_write_back_file() {
        use How::*;
        assert_eq!(flush_plan(&[Sync, Sync]), vec![]);
        assert_eq!(
            flush_plan(&[
                Sync,
                WriteBack(7),
                WriteBack(9),
                WriteBack(7),
                Sync,
                WriteBack(9)
            ]),
            vec![(7, 1), (9, 2)]
        );
        assert_eq!(flush_plan(&[WriteBack(3), WriteBack(3)]).len(), 1);
    }

    /// Write-back files are made durable by their device's flush, which
    /// must come after every file of the round (a flush only covers
    /// writes completed before it), and the round ends after the flushes.
    #[test]
    fn a_round_flushes_each_device_after_every_file() {
        for helpers in [0, 1, 3, 8] {
            let (faults, pool) = traced_pool(helpers);
            let (_dir, files) = temp_files(5);
            let mut round = synced(&files);
            round[0].1 = How::WriteBack(7);
            round[2].1 = How::WriteBack(9);
            round[3].1 = How::WriteBack(7);
            let at_done = Arc::new(AtomicUsize::new(usize::MAX));
            let seen = at_done.clone();
            let f = faults.clone();
            let on_done: OnDone = Arc::new(move || {
                seen.store(crate::locks::lock(&f.trace).len(), Ordering::SeqCst);
            });
            let r = pool.start(round_of(&round), on_done).wait();
            assert_eq!(r.len(), 5);
            assert!(r.iter().all(|r| r.is_ok()), "{helpers} helpers");
            let trace = trace_of(&faults);
            // 3 write-backs, 2 fsyncs of their own, 2 flushes.
            assert_eq!(trace.len(), 7, "{helpers} helpers: {trace:?}");
            let count = |what: &str, f: &SegFile| {
                trace
                    .iter()
                    .filter(|(w, i, _)| *w == what && *i == ino(f))
                    .count()
            };
            for (i, f) in files.iter().enumerate() {
                let (wb, fs) = match i {
                    0 | 2 => (1, 1), // written back, then its device's flush
                    3 => (1, 0),     // its device flushes through file 0
                    _ => (0, 1),
                };
                assert_eq!(
                    (count("write-back", f), count("fsync", f)),
                    (wb, fs),
                    "file {i}"
                );
            }
            // Both flushes come after all five files.
            let flushes: Vec<usize> = trace
                .iter()
                .enumerate()
                .filter(|(_, (w, i, _))| {
                    *w == "fsync" && (*i == ino(&files[0]) || *i == ino(&files[2]))
                })
                .map(|(at, _)| at)
                .collect();
            assert_eq!(flushes.len(), 2);
            assert!(
                flushes.iter().all(|&at| at >= 5),
                "{helpers} helpers: {trace:?}"
            );
            // The round ended after the flushes.
            let t = std::time::Instant::now();
            while at_done.load(Ordering::SeqCst) == usize::MAX && t.elapsed().as_secs() < 5 {
                std::thread::yield_now();
            }
            assert_eq!(at_done.load(Ordering::SeqCst), 7, "{helpers} helpers");
        }
    }

    /// A round run here, with helpers idle beside it, is done when the
    /// call returns, and every write, write-back, fsync and flush of it
    /// ran on the calling thread in the helpers' order: the files with
    /// their held-back writes, then the late file, then the device flush.
    #[test]
    fn a_round_run_here_runs_every_step_on_this_thread_in_order() {
        use crate::direct::{BufPool, DeferredWrite};
        let (faults, pool) = traced_pool(3);
        let (dir, files) = temp_files(4);
        let bufs = BufPool::default();
        let round: Vec<RoundFile> = files
            .iter()
            .enumerate()
            .map(|(i, f)| RoundFile {
                writes: vec![DeferredWrite::new(
                    f.clone(),
                    None,
                    0,
                    &[i as u8 + 1; 5000],
                    &bufs,
                )],
                late: i == 1,
                ..RoundFile::sync(
                    f.clone(),
                    if i == 3 { How::Sync } else { How::WriteBack(7) },
                )
            })
            .collect();
        let called = Arc::new(AtomicUsize::new(0));
        let c = called.clone();
        let mut r = pool.run_here(
            round,
            Arc::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert_eq!(
            called.load(Ordering::SeqCst),
            1,
            "on_done ran before the return"
        );
        assert!(r.is_done(), "nothing left to wait for");
        assert!(r.ran_here());
        let results = r.wait();
        assert_eq!(results.len(), 4);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        let me = std::thread::current().name().unwrap_or("").to_string();
        let trace = trace_of(&faults);
        assert!(
            trace.iter().all(|(_, _, t)| *t == me),
            "every step on the calling thread ({me}): {trace:?}"
        );
        let steps: Vec<(&str, u64)> = trace.iter().map(|(w, i, _)| (*w, *i)).collect();
        let f = |i: usize| ino(&files[i]);
        assert_eq!(
            steps,
            vec![
                ("deferred-write", f(0)),
                ("write-back", f(0)),
                ("deferred-write", f(2)),
                ("write-back", f(2)),
                ("deferred-write", f(3)),
                ("fsync", f(3)),
                ("deferred-write", f(1)),
                ("write-back", f(1)),
                ("fsync", f(0)),
            ],
            "files in order, the late one after them, the flush last"
        );
        for i in 0..4 {
            let back = std::fs::read(dir.path().join(format!("f{i}"))).expect("read back");
            assert!(
                back.len() == 5000 && back.iter().all(|&b| b == i as u8 + 1),
                "file {i}"
            );
        }
    }

    /// Held-back writes run on the file's helper before its sync, and the
    /// late files (end-writes) start only once every other file of the
    /// round is written and synced.
    #[test]
    fn late_files_start_after_every_other_file_and_writes_precede_syncs() {
        use crate::direct::{BufPool, DeferredWrite};
        for helpers in [0, 1, 3, 8] {
            let (faults, pool) = traced_pool(helpers);
            let (dir, files) = temp_files(5);
            let bufs = BufPool::default();
            let late = [false, true, false, true, false];
            let round: Vec<RoundFile> = files
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let direct = f.open_direct().ok().map(Arc::new);
                    let bytes = vec![i as u8 + 1; 3 * 4096 + 100];
                    RoundFile {
                        writes: vec![DeferredWrite::new(f.clone(), direct, 100, &bytes, &bufs)],
                        late: late[i],
                        ..RoundFile::sync(f.clone(), How::Sync)
                    }
                })
                .collect();
            let r = pool.start(round, Arc::new(|| {})).wait();
            assert!(r.iter().all(|r| r.is_ok()), "{helpers} helpers: {r:?}");
            let trace = trace_of(&faults);
            let at = |what: &str, f: &SegFile| {
                trace
                    .iter()
                    .position(|(w, i, _)| *w == what && *i == ino(f))
                    .unwrap_or_else(|| panic!("{what} missing: {trace:?}"))
            };
            for (i, f) in files.iter().enumerate() {
                assert!(at("deferred-write", f) < at("fsync", f), "{trace:?}");
                let back = std::fs::read(dir.path().join(format!("f{i}"))).expect("read back");
                assert_eq!(back.len(), 100 + 3 * 4096 + 100, "file {i}");
                assert!(back[100..].iter().all(|&b| b == i as u8 + 1), "file {i}");
            }
            let last_first = [0, 2, 4].map(|i| at("fsync", &files[i])).into_iter().max();
            for i in [1, 3] {
                assert!(
                    Some(at("deferred-write", &files[i])) > last_first,
                    "{helpers} helpers: {trace:?}"
                );
            }
        }
    }

    /// The device flush that ends a round runs on the helper that finished
    /// the round's last write-back, not on a helper woken for it: a
    /// hand-off there would delay every round by a wake-up. The syncs are
    /// slowed so that every helper ends after the writer's own tick (the
    /// writer never runs a flush itself).
    #[test]
    fn the_flush_runs_on_the_helper_that_finished_the_last_write_back() {
        let (faults, pool) = traced_pool(8);
        faults.slow_syncs(std::time::Duration::from_millis(30));
        let (_dir, files) = temp_files(3);
        let round: Vec<_> = files
            .iter()
            .map(|f| (f.clone(), How::WriteBack(7)))
            .collect();
        let r = pool.start(round_of(&round), Arc::new(|| {})).wait();
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        let trace = trace_of(&faults);
        assert_eq!(trace.len(), 4, "3 write-backs and a flush: {trace:?}");
        let helpers: Vec<&String> = trace
            .iter()
            .filter(|(w, _, _)| *w == "write-back")
            .map(|(_, _, t)| t)
            .collect();
        assert_eq!(helpers.len(), 3, "{trace:?}");
        assert!(
            helpers.iter().all(|t| t.starts_with("melddb-log-fsync-")),
            "{trace:?}"
        );
        let flush = trace
            .iter()
            .find(|(w, _, _)| *w == "fsync")
            .expect("the round's flush");
        assert_eq!(flush.1, ino(&files[0]), "flushed through the first file");
        assert!(
            helpers.contains(&&flush.2),
            "the flush ran on {}, not on a write-back's helper: {trace:?}",
            flush.2
        );
    }

    #[test]
    fn a_failed_flush_fails_that_devices_write_back_files_only() {
        let (faults, pool) = traced_pool(3);
        let (_dir, files) = temp_files(4);
        let mut round = synced(&files);
        round[0].1 = How::WriteBack(7);
        round[1].1 = How::WriteBack(7);
        round[2].1 = How::WriteBack(9);
        // Device 7's flush goes through file 0; only the flush fsyncs it.
        faults.fail_sync_of.store(ino(&files[0]), Ordering::SeqCst);
        let r = pool.start(round_of(&round), Arc::new(|| {})).wait();
        for i in [0, 1] {
            let e = r[i].as_ref().expect_err("device 7's files failed");
            assert!(e.to_string().contains("flush"), "{e}");
        }
        assert!(r[2].is_ok() && r[3].is_ok(), "{r:?}");
    }

    #[test]
    fn every_file_gets_a_result_in_order() {
        for helpers in [0, 1, 3, 8] {
            let pool = SyncPool::new(helpers, Arc::new(Faults::none()));
            for n in [0, 1, 2, 5, 9] {
                let (_dir, files) = temp_files(n);
                let calls = Arc::new(AtomicUsize::new(0));
                let c = calls.clone();
                let on_done: OnDone = Arc::new(move || {
                    c.fetch_add(1, Ordering::SeqCst);
                });
                let r = pool.start(round_of(&synced(&files)), on_done).wait();
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
        let (faults, pool) = traced_pool(3);
        let (_dir, files) = temp_files(6);
        faults.fail_syncs(true);
        let mut files = synced(&files);
        files[1].1 = How::WriteBack(1);
        files[4].1 = How::WriteBack(2);
        let r = pool.start(round_of(&files), Arc::new(|| {})).wait();
        assert_eq!(r.len(), 6);
        assert!(r.iter().all(|r| r.is_err()));
        faults.fail_syncs(false);
        assert!(pool
            .start(round_of(&files), Arc::new(|| {}))
            .wait()
            .iter()
            .all(|r| r.is_ok()));
    }

    /// With write-back files on two devices and a late file, a round on
    /// the helpers answers each file once: the two flushes' results
    /// (after the files') are not mistaken for files'.
    #[test]
    fn write_back_rounds_answer_every_file_once() {
        let (faults, pool) = traced_pool(2);
        let (_dir, files) = temp_files(5);
        let hows = [
            How::WriteBack(7),
            How::Sync,
            How::WriteBack(9),
            How::WriteBack(7),
            How::Sync,
        ];
        let round = || -> Vec<RoundFile> {
            files
                .iter()
                .zip(hows)
                .enumerate()
                .map(|(i, (f, how))| RoundFile {
                    late: i == 4,
                    ..RoundFile::sync(f.clone(), how)
                })
                .collect()
        };
        let r = pool.start(round(), Arc::new(|| {}));
        assert_eq!((r.write_backs(), r.flushes(), r.ran_here()), (3, 2, false));
        let results = r.wait();
        assert_eq!(results.len(), 5);
        assert!(
            results.iter().all(|r| r.is_ok()),
            "the helpers: {results:?}"
        );
        let trace = trace_of(&faults);
        let steps: Vec<&str> = trace.iter().map(|t| t.0).collect();
        // Three write-backs and two fsyncs of files in some order, then
        // the late file's fsync, then the two flushes.
        assert_eq!(steps.len(), 7, "{trace:?}");
        assert_eq!(trace[4].1, ino(&files[4]), "the late file fifth: {trace:?}");
        let mut flushed: Vec<u64> = trace[5..].iter().map(|t| t.1).collect();
        flushed.sort_unstable();
        let mut want = vec![ino(&files[0]), ino(&files[2])];
        want.sort_unstable();
        assert_eq!(flushed, want, "each device flushed last: {trace:?}");
    }

    /// A round is done once every file and flush has answered, and not
    /// before: the writer answers a batch when `is_done` says so (without
    /// blocking), and acknowledging before the flush would acknowledge
    /// appends that are not durable.
    #[test]
    fn a_round_is_done_once_every_file_and_flush_answered_and_not_before() {
        let (faults, pool) = traced_pool(3);
        faults.slow_syncs(std::time::Duration::from_millis(300));
        let (_dir, files) = temp_files(3);
        let mut round = synced(&files);
        round[0].1 = How::WriteBack(7);
        round[1].1 = How::WriteBack(7);
        let mut r = pool.start(round_of(&round), Arc::new(|| {}));
        assert_eq!((r.write_backs(), r.flushes(), r.ran_here()), (2, 1, false));
        assert!(!r.is_done(), "every sync takes 300 ms");
        let t = std::time::Instant::now();
        while !r.is_done() {
            assert!(t.elapsed().as_secs() < 30, "the round never ended");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let trace = trace_of(&faults);
        assert_eq!(
            trace.len(),
            4,
            "two write-backs, an fsync and the flush, all answered: {trace:?}"
        );
        let results = r.wait();
        assert_eq!(results.len(), 3);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    }

    /// With as many helpers as files, each file of a round goes to a
    /// helper of its own, so their syncs run side by side.
    #[test]
    fn a_rounds_files_go_to_a_helper_each() {
        let (faults, pool) = traced_pool(3);
        let (_dir, files) = temp_files(3);
        let r = pool
            .start(round_of(&synced(&files)), Arc::new(|| {}))
            .wait();
        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
        let trace = trace_of(&faults);
        let threads: std::collections::BTreeSet<&str> =
            trace.iter().map(|t| t.2.as_str()).collect();
        assert_eq!(threads.len(), 3, "{trace:?}");
        assert!(
            threads.iter().all(|t| t.starts_with("melddb-log-fsync-")),
            "{trace:?}"
        );
    }

    /// Dropping the pool waits for its helpers, so a sync under way has
    /// ended (and the helpers let go of what they hold) when the drop
    /// returns: the store closes its files after.
    #[test]
    fn dropping_the_pool_waits_for_a_sync_under_way() {
        let (faults, pool) = traced_pool(2);
        faults.slow_syncs(std::time::Duration::from_millis(200));
        let (_dir, files) = temp_files(1);
        let round = pool.start(round_of(&synced(&files)), Arc::new(|| {}));
        drop(pool);
        assert_eq!(
            trace_of(&faults).len(),
            1,
            "the sync ended before the drop returned"
        );
        assert_eq!(Arc::strong_count(&faults), 1, "every helper ended");
        let results = round.wait();
        assert!(results.len() == 1 && results[0].is_ok(), "{results:?}");
    }
}
