//! The roll-forward thread of a node on a shared log, and the state it
//! shares with the committing threads.
//!
//! The thread owns the melder. It consumes the service's subscription in
//! log order, melds every entry (its own commits with the intention the
//! committing thread already built, everyone else's from their bytes),
//! publishes each new committed state for transactions to begin on, and
//! hands the outcomes of this node's commits to the threads waiting for
//! them. Meld is deterministic, so every node that follows the log reaches
//! the same states whatever the timing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use melddb::checkpoint::{TrackEvent, Tracker};
use melddb::{LocalIntention, LogPos, MeldState, Melder, Outcome};
use melddb_log::{Client, ClientError};

use crate::DbError;

/// How long one wait for the next entry lasts before the thread looks at
/// its stop flag again.
const POLL: Duration = Duration::from_millis(100);

/// First pause before subscribing again after the service went away;
/// doubles up to [`MAX_BACKOFF`].
const BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What the committing threads and the roll-forward thread share.
pub(crate) struct Follow {
    /// The latest committed state: what transactions begin on.
    pub latest: RwLock<MeldState>,
    st: Mutex<FollowState>,
    /// Signalled whenever entries were melded or the thread stopped.
    pub melded: Condvar,
    /// This node publishes a checkpoint once this many entry bytes were
    /// melded since the latest begin record (`None`: it does not publish).
    publish_every: Option<u64>,
    /// The change feed's watchers.
    feeds: Arc<crate::feed::Feeds>,
}

/// The roll-forward thread's progress, under [`Follow`]'s lock.
#[derive(Default)]
pub(crate) struct FollowState {
    /// The next position to meld.
    pub next: LogPos,
    /// The position of the latest committed state (behind `next - 1`
    /// while a group-meld pair waits for its second entry).
    pub lcs: LogPos,
    /// Intentions of this node's commits, by position, not melded yet.
    own: HashMap<LogPos, LocalIntention>,
    /// The lowest position each append still in flight can land at (the
    /// `next` when it was sent), counted: outcomes at or past the lowest
    /// are kept, since one of them may be that append's.
    floors: BTreeMap<LogPos, usize>,
    /// Positions of this node's appended commits whose committers have
    /// not taken their outcome yet.
    wanted: BTreeSet<LogPos>,
    /// Outcomes kept for committers (see `floors` and `wanted`).
    outcomes: BTreeMap<LogPos, Outcome>,
    /// Entries and bytes melded since the node started.
    pub entries: u64,
    pub bytes: u64,
    /// Times the subscription was opened again after the service went
    /// away.
    pub resubscribed: u64,
    /// Whether the subscription is up.
    pub connected: bool,
    /// Why the thread stopped for good, if it did.
    pub failed: Option<DbError>,
    stop: bool,
    /// The latest checkpoint begin record melded, with the state there
    /// (what that checkpoint encodes).
    pub last_begin: Option<(LogPos, MeldState)>,
    /// The latest complete checkpoint melded: its begin and its parts.
    pub last_complete: Option<(LogPos, Vec<LogPos>)>,
    /// Bytes of the entries other than checkpoint records melded since
    /// the latest begin record (or the start).
    pub since_begin: u64,
    /// Bytes of the latest complete checkpoint's parts.
    pub last_size: u64,
    /// Set when this node publishes checkpoints and one is due (see
    /// `publish`); cleared by the publishing thread when it starts one.
    pub due: bool,
    /// The publishing thread is writing a checkpoint.
    pub publishing: bool,
    /// Figures of the checkpoints this node published.
    pub published: Published,
    /// Times the node rejoined from a published checkpoint, and the
    /// ranges of positions it skipped doing so (first, end).
    pub rejoins: u64,
    skipped: Vec<(LogPos, LogPos)>,
}

/// What the publishing thread did, for `Database::log_stats`.
#[derive(Default, Clone)]
pub(crate) struct Published {
    pub last: Option<crate::CheckpointInfo>,
    pub written: u64,
    pub trims: u64,
    pub first: LogPos,
    pub error: Option<DbError>,
    /// Publishes begun so far, and which one `error` came from.
    pub attempts: u64,
    pub error_attempt: u64,
}

impl Follow {
    pub fn new(
        latest: MeldState,
        next: LogPos,
        publish_every: Option<u64>,
        feeds: Arc<crate::feed::Feeds>,
    ) -> Follow {
        let lcs = latest.snapshot().pos();
        Follow {
            publish_every,
            feeds,
            latest: RwLock::new(latest),
            st: Mutex::new(FollowState {
                next,
                lcs,
                connected: true,
                ..FollowState::default()
            }),
            melded: Condvar::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, FollowState> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The latest committed state.
    pub fn latest(&self) -> MeldState {
        self.latest
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks the thread to stop.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.melded.notify_all();
    }
}

impl FollowState {
    /// An append is about to be sent: its entry lands at `next` or later,
    /// so outcomes from there on are kept until it lands. Returns the
    /// floor to give to [`FollowState::landed`] or
    /// [`FollowState::not_sent`].
    pub fn enter(&mut self) -> LogPos {
        *self.floors.entry(self.next).or_default() += 1;
        self.next
    }

    fn leave(&mut self, floor: LogPos) {
        if let Some(n) = self.floors.get_mut(&floor) {
            *n -= 1;
            if *n == 0 {
                self.floors.remove(&floor);
            }
        }
    }

    /// Drops the outcomes nobody can still want.
    fn prune(&mut self) {
        let low = self.floors.keys().next().copied().unwrap_or(LogPos::MAX);
        let wanted = &self.wanted;
        self.outcomes.retain(|p, _| *p >= low || wanted.contains(p));
    }

    /// The append that entered at `floor` landed at `pos` with `local`:
    /// its outcome is kept from now on by position, and the roll-forward
    /// thread uses `local` if it has not melded `pos` yet.
    pub fn landed(&mut self, floor: LogPos, pos: LogPos, local: LocalIntention) {
        self.leave(floor);
        self.wanted.insert(pos);
        if pos >= self.next {
            self.own.insert(pos, local);
        }
        self.prune();
    }

    /// The append that entered at `floor` failed: nothing landed.
    pub fn not_sent(&mut self, floor: LogPos) {
        self.leave(floor);
        self.prune();
    }

    /// Whether the roll-forward thread keeps the outcome of `pos`.
    fn keeps(&self, pos: LogPos) -> bool {
        self.wanted.contains(&pos) || self.floors.keys().next().is_some_and(|&low| pos >= low)
    }

    /// Whether the node skipped `pos` when it rejoined from a checkpoint
    /// (its outcome is unknown here).
    pub fn skipped(&self, pos: LogPos) -> bool {
        self.skipped.iter().any(|&(a, b)| (a..b).contains(&pos))
    }

    /// The outcome of `pos`, once melded.
    pub fn take_outcome(&mut self, pos: LogPos) -> Option<Outcome> {
        self.outcomes.remove(&pos)
    }

    /// The commit at `pos` is done (answered, or its handle dropped).
    pub fn settle(&mut self, pos: LogPos) {
        self.wanted.remove(&pos);
        self.own.remove(&pos);
        self.outcomes.remove(&pos);
        self.prune();
    }

    /// Commits sent and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.floors.values().sum::<usize>() + self.wanted.len()
    }

    /// Whether the thread stopped (asked to, or failed).
    /// The error a call gets from a node that stopped.
    pub fn stopped(&self) -> Option<DbError> {
        if let Some(e) = &self.failed {
            return Some(e.clone().stopping());
        }
        self.stop.then_some(DbError::Closed)
    }
}

/// A batch of consecutive entries from the subscription: the first's
/// position and their bytes.
type Batch = Result<(LogPos, Vec<bytes::Bytes>), ClientError>;

/// Streams `log` from `from` on a task of the node's runtime into a
/// bounded channel. The roll-forward thread waits on the channel with a
/// timeout (to look at its stop flag); the subscription itself, with its
/// reconnection and back-off state, is never cancelled by those waits.
fn stream(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    log: &str,
    from: LogPos,
) -> (tokio::sync::mpsc::Receiver<Batch>, AbortOnDrop) {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let (client, log) = (client.clone(), log.to_string());
    let task = rt.spawn(async move {
        // Batched pushes: the catch-up of a long log reads the store in
        // ranges, and a live log's entries come as they are ready.
        let mut sub = client.subscribe_batches(&log, from);
        loop {
            let batch = sub.next_batch().await;
            let end = batch.is_err();
            if tx.send(batch).await.is_err() || end {
                return;
            }
        }
    });
    (rx, AbortOnDrop(task))
}

/// Stops a streaming task when the subscription it feeds is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Marks the node failed if the roll-forward thread unwinds, so no
/// committer, reader or publisher waits for it forever.
struct PanicGuard<'a>(&'a Follow);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut st = self.0.lock();
            st.failed = Some(DbError::Internal("the roll-forward thread panicked"));
            st.connected = false;
            drop(st);
            self.0.melded.notify_all();
        }
    }
}

/// The melder and what the roll-forward thread tracks beside it.
struct Roller {
    melder: Melder,
    settings: melddb::Settings,
    /// The checkpoint records as the melder sees them, for publishing and
    /// for the pointers a joining node reads.
    tracker: Tracker,
    parts: Vec<LogPos>,
    part_bytes: u64,
    /// Group meld: the first entry of a pair waiting for its second, and
    /// the state before the pair (for the change feed).
    pending: Option<(LogPos, bytes::Bytes)>,
    before: Option<melddb::Snapshot>,
    /// Local checkpoints and the node cache (`None`: off).
    cache: Option<super::cache::CacheSide>,
}

impl Roller {
    /// The log was trimmed past this node's position while it was away:
    /// goes on from the latest published checkpoint, as a joining node
    /// starts. The entries in between are never melded here; commits of
    /// this node among them answer [`DbError::OutcomeUnknown`]. False if
    /// no published checkpoint takes the node past its position.
    fn rejoin(
        &mut self,
        rt: &tokio::runtime::Runtime,
        client: &Client,
        log: &str,
        shared: &Follow,
    ) -> bool {
        let Ok((Some((_, loaded)), _)) = rt.block_on(super::published::latest(client, log, None))
        else {
            return false;
        };
        let melder = Melder::from_checkpoint(loaded);
        let (from, to) = (self.melder.next_pos(), melder.next_pos());
        let lcs = melder.lcs().pos();
        let state = match melder.meld_state(lcs) {
            Some(s) if to > from && *melder.settings() == self.settings => s.clone(),
            _ => return false,
        };
        self.tracker = melder.tracker().clone();
        self.melder = melder;
        self.parts.clear();
        self.part_bytes = 0;
        self.pending = None;
        self.before = None;
        *shared
            .latest
            .write()
            .unwrap_or_else(PoisonError::into_inner) = state;
        let mut st = shared.lock();
        st.next = to;
        st.lcs = lcs;
        st.rejoins += 1;
        st.skipped.push((from, to));
        st.own.retain(|p, _| *p >= to);
        st.last_begin = None;
        st.last_complete = None;
        st.since_begin = 0;
        true
    }

    /// After a batch: a read-back failure stops the node (its decisions
    /// since are meaningless); the node cache sweeps when due, and readers
    /// move to the swept tree.
    fn housekeep(&mut self, shared: &Follow) -> Result<(), DbError> {
        if let Some(e) = self.melder.read_error() {
            return Err(DbError::Store(e.clone()));
        }
        let Some(c) = &mut self.cache else {
            return Ok(());
        };
        if c.sweep(&mut self.melder)? {
            if let Some(state) = self.melder.snapshot_state(self.melder.lcs().pos()) {
                *shared
                    .latest
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = state.clone();
            }
        }
        Ok(())
    }

    /// Melds the entry at `pos` (the next one) and tells the committers.
    /// A read-back failure (node cache) stops here, before anything of
    /// the entry is published: the decisions since are meaningless.
    fn meld(&mut self, shared: &Follow, pos: LogPos, bytes: bytes::Bytes) -> Result<(), DbError> {
        let settings = self.settings;
        let event = self.tracker.feed(&settings, pos, &bytes);
        let local = shared.lock().own.remove(&pos);
        let watched = shared.feeds.any();
        if watched && self.before.is_none() {
            self.before = Some(self.melder.lcs().clone());
        }
        let outcomes = match local {
            Some(local) => self.melder.apply_local(&bytes, local),
            None => self.melder.apply(&bytes),
        };
        if let Some(e) = self.melder.read_error() {
            return Err(DbError::Store(e.clone()));
        }
        if watched {
            publish_changes(
                &shared.feeds,
                &outcomes,
                (pos, &bytes),
                &self.pending,
                self.before.as_ref(),
            );
        }
        if outcomes.is_empty() && settings.group_meld {
            // The first of a pair: decided with the next entry.
            self.pending = Some((pos, bytes.clone()));
        } else {
            self.pending = None;
            self.before = None;
        }
        let lcs = self.melder.lcs().pos();
        if let Some(state) = self.melder.snapshot_state(lcs) {
            *shared
                .latest
                .write()
                .unwrap_or_else(PoisonError::into_inner) = state.clone();
        }
        let mut st = shared.lock();
        st.next = self.melder.next_pos();
        st.lcs = lcs;
        st.entries += 1;
        st.bytes += bytes.len() as u64;
        st.connected = true;
        match event {
            TrackEvent::Begin => {
                self.parts.clear();
                self.part_bytes = 0;
                st.since_begin = 0;
                // Only a publishing node encodes the state there; others
                // need not keep it alive.
                if shared.publish_every.is_some() {
                    st.last_begin = self.melder.meld_state(pos).map(|s| (pos, s.clone()));
                }
            }
            TrackEvent::Part => {
                self.parts.push(pos);
                self.part_bytes += bytes.len() as u64;
            }
            TrackEvent::Complete { begin } => {
                self.parts.push(pos);
                st.last_size = self.part_bytes + bytes.len() as u64;
                st.last_complete = Some((begin, std::mem::take(&mut self.parts)));
            }
            // Only the log's own work counts toward the next checkpoint,
            // not the checkpoints written into it.
            TrackEvent::NotCheckpoint | TrackEvent::Invalid(_) => {
                st.since_begin += bytes.len() as u64;
                if let Some(c) = &mut self.cache {
                    c.melded(bytes.len() as u64);
                }
            }
        }
        if let Some(c) = &mut self.cache {
            if event == TrackEvent::Begin {
                if let Some(s) = self.melder.meld_state(pos) {
                    c.begin(s.snapshot());
                }
            }
            if c.wants_begin(st.since_begin) {
                c.ask_begin(settings.db_id);
            } else if c.pressure && shared.publish_every.is_some() && !st.publishing {
                // A publishing node's next checkpoint serves the cache too.
                st.due = true;
            }
        }
        if let Some(every) = shared.publish_every {
            // At least twice the latest checkpoint's size, so a large
            // database does not spend its log on checkpoints.
            if st.since_begin >= every.max(2 * st.last_size) && !st.publishing {
                st.due = true;
            }
        }
        for o in outcomes {
            if let Some(p) = o.pos().filter(|&p| st.keeps(p)) {
                st.outcomes.insert(p, o);
            }
        }
        Ok(())
    }
}

/// The roll-forward thread: melds the log from `melder.next_pos()` on,
/// subscribing again whenever the service goes away, until asked to stop
/// or the log cannot be followed (trimmed past this node's position).
pub(crate) fn follow(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    url: &str,
    log: &str,
    melder: Melder,
    shared: &Arc<Follow>,
    cache: Option<super::cache::CacheSide>,
) {
    let _guard = PanicGuard(shared);
    let mut r = Roller {
        settings: *melder.settings(),
        tracker: melder.tracker().clone(),
        melder,
        parts: Vec::new(),
        part_bytes: 0,
        pending: None,
        before: None,
        cache,
    };
    let mut backoff = BACKOFF;
    'subscribe: loop {
        let (mut rx, _task) = stream(rt, client, log, r.melder.next_pos());
        loop {
            if shared.lock().stop {
                return;
            }
            let next = rt.block_on(async { tokio::time::timeout(POLL, rx.recv()).await });
            let (first, entries) = match next {
                Err(_elapsed) => {
                    // No entry for a while: readers may still have loaded
                    // much of the tree back.
                    if let Err(e) = r.housekeep(shared) {
                        return fail(shared, e);
                    }
                    continue;
                }
                Ok(Some(Ok(batch))) => batch,
                Ok(None) | Ok(Some(Err(_))) if shared.lock().stop => return,
                Ok(result) => {
                    let e = result.and_then(Result::err);
                    let next = r.melder.next_pos();
                    let err = e.as_ref().and_then(|e| fatal(e, url, log, next));
                    if matches!(err, Some(DbError::TrimmedBehind { .. }))
                        && r.rejoin(rt, client, log, shared)
                    {
                        shared.melded.notify_all();
                        continue 'subscribe;
                    }
                    if let Some(err) = err {
                        return fail(shared, err);
                    }
                    {
                        let mut st = shared.lock();
                        st.connected = false;
                        st.resubscribed += 1;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue 'subscribe;
                }
            };
            backoff = BACKOFF;
            for (i, bytes) in entries.into_iter().enumerate() {
                let pos = first + i as u64;
                if pos != r.melder.next_pos() {
                    // The subscription guarantees order; anything else is
                    // a broken stream: start it again where meld stands.
                    continue 'subscribe;
                }
                if let Err(e) = r.meld(shared, pos, bytes) {
                    return fail(shared, e);
                }
            }
            if let Err(e) = r.housekeep(shared) {
                return fail(shared, e);
            }
            shared.melded.notify_all();
        }
    }
}

/// Stops following for good: every waiter gets `e`.
fn fail(shared: &Follow, e: DbError) {
    let mut st = shared.lock();
    st.failed = Some(e);
    st.connected = false;
    drop(st);
    shared.melded.notify_all();
}

/// Hands the committed ones among `outcomes` to the change feed: the
/// entry just melded (`current`) and, under group meld, the first of its
/// pair (`pending`), both melded onto `before`.
fn publish_changes(
    feeds: &crate::feed::Feeds,
    outcomes: &[Outcome],
    current: (LogPos, &[u8]),
    pending: &Option<(LogPos, bytes::Bytes)>,
    before: Option<&melddb::Snapshot>,
) {
    let Some(before) = before else { return };
    // Keys the pair's first entry put, present for its second.
    let mut put_first: Vec<Vec<u8>> = Vec::new();
    for o in outcomes {
        let Outcome::Committed { pos, .. } = o else {
            continue;
        };
        let bytes: &[u8] = match pending {
            Some((p, b)) if p == pos => b,
            _ if *pos == current.0 => current.1,
            _ => continue,
        };
        feeds.publish(*pos, bytes, |k| {
            put_first.iter().any(|p| p[..] == *k) || before.get(k).ok().flatten().is_some()
        });
        if let Ok(parsed) = melddb::parse(bytes) {
            put_first.extend(
                parsed
                    .changes()
                    .into_iter()
                    .filter(|(_, v)| v.is_some())
                    .map(|(k, _)| k.to_vec()),
            );
        }
    }
}

/// An error that ends following for good, with what to do; `None` for
/// one worth subscribing again after (the service restarting).
fn fatal(e: &ClientError, url: &str, log: &str, next: LogPos) -> Option<DbError> {
    match e {
        ClientError::Server {
            code: melddb_log::protocol::Code::Trimmed,
            a,
            ..
        } => Some(DbError::TrimmedBehind {
            log: log.to_string(),
            first: *a,
            next,
        }),
        ClientError::Server {
            code: melddb_log::protocol::Code::Forbidden | melddb_log::protocol::Code::Unauthorized,
            ..
        } => Some(DbError::Service {
            url: url.to_string(),
            source: e.clone(),
        }),
        _ => None,
    }
}
