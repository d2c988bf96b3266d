//! A node on a log of the log service: `Database::connect`.
//!
//! Every node is a full database: it begins transactions on its own copy
//! of the latest committed state, appends their intentions to the shared
//! log on the service (the only arbitration: the service orders the
//! appends of every node), and rolls the log forward from the service's
//! subscription with meld, which decides each intention's fate the same
//! way on every node ([`follow`]). A commit is answered once this node has
//! melded its entry; the service acknowledges an append only once it is
//! durable, so an answered commit survives the service's crash too.
//!
//! With group meld on, an entry that lands first in a pair is decided with
//! the next one. When no other commit follows within [`PAIR_WAIT`], the
//! waiting committer appends an empty entry (every node rejects it as
//! malformed) to close the pair.
//!
//! The node directory is locked for the node's life, like an embedded
//! database's. Connecting loads the latest published checkpoint of the log
//! (`published`), or starts from the genesis record if there is none, and
//! melds the log from there up to the tail it finds, then follows it.
//!
//! The node's calls block their thread (on its own I/O runtime); from
//! inside an async runtime they answer `DbError::Unsupported` instead of
//! panicking: call them through `spawn_blocking`.

mod cache;
mod follow;
mod local;
mod publish;
mod published;
mod url;

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use melddb::{LocalIntention, LogPos, MeldState, Melder, Outcome, Settings};
use melddb_log::{Client, ClientOptions};

use self::cache::{CacheSide, LocalShared};
use self::follow::Follow;
use self::local::LocalCheckpoints;
use self::url::LogUrl;
pub use self::url::SCHEME;
use crate::embedded::dir_lock::DirLock;
use crate::embedded::{
    CacheStats, CheckpointFailure, CheckpointInfo, DbError, LogStats, Options, Recovery,
    Unrecoverable, Unsupported,
};
use crate::nodestore::LogStore;

/// The node's I/O runtime. Dropped without blocking, so the last handle
/// to go may be dropped anywhere, an async context included.
pub(crate) struct Rt(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Rt {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        // Only `drop` takes it.
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("the runtime is only taken on drop"))
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Rt {
    /// Runs `fut` on the node's runtime and waits for it on this thread.
    /// The wait is a plain blocking one, so it works from any thread, one
    /// of an async runtime's included (where it blocks that thread, like
    /// any blocking call).
    pub(crate) fn run<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, DbError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| DbError::Closed)
    }
}

/// How long a committer whose entry opened a group-meld pair waits for
/// another entry before it closes the pair with an empty one.
pub(crate) const PAIR_WAIT: Duration = Duration::from_millis(2);

/// A node on a shared log.
pub(crate) struct Remote {
    url: String,
    log: String,
    settings: Settings,
    rt: Arc<Rt>,
    client: Client,
    follow: Arc<Follow>,
    follower: Option<JoinHandle<()>>,
    publisher: Option<JoinHandle<()>>,
    recovery: Recovery,
    max_in_flight: usize,
    commit_timeout: Option<Duration>,
    /// The local checkpoint thread's figures and the node cache's.
    local: Arc<LocalShared>,
    store: Arc<LogStore>,
    checkpointer: Option<JoinHandle<()>>,
    _lock: DirLock,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("url", &self.url).finish()
    }
}

/// A commit appended to the shared log and waiting to be melded.
pub(crate) struct RemoteHandle {
    pos: LogPos,
    follow: Arc<Follow>,
    rt: Arc<Rt>,
    client: Client,
    log: String,
    group_meld: bool,
    done: bool,
    /// When the wait for the outcome gives up.
    deadline: Option<(Instant, Duration)>,
}

impl Remote {
    /// Connects to the log at `url` (`melddb://host:port/LOG`), creating it
    /// with `opts.settings` if it is empty, melds it up to its tail and
    /// starts following it. `dir` is locked for the node's life.
    pub(crate) fn connect(
        url: &str,
        dir: &Path,
        opts: &Options,
        token: Option<String>,
        feeds: Arc<crate::feed::Feeds>,
    ) -> Result<Remote, DbError> {
        let started = Instant::now();
        let parsed = LogUrl::parse(url)?;
        let lock = DirLock::take(dir)?;
        let service = |e: melddb_log::ClientError| DbError::Service {
            url: url.to_string(),
            source: e,
        };
        let rt = Rt(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("melddb-node-io")
                .enable_all()
                .build()
                .map_err(|e| DbError::thread("I/O", e))?,
        ));
        let copts = ClientOptions {
            token,
            ..ClientOptions::default()
        };
        // Appends and the subscription on two connections, so a long
        // catch-up stream never queues ahead of a commit's answer.
        let connect = |copts: ClientOptions| {
            let addr = parsed.addr.clone();
            rt.run(async move { Client::connect_with(&addr, copts).await })
        };
        let client = connect(copts.clone())?.map_err(service)?;
        let stream = connect(copts)?.map_err(service)?;
        let log = parsed.log.clone();
        let (c, l) = (client.clone(), log.clone());
        let (first, tail) = rt
            .run(async move { c.bounds(&l).await })?
            .map_err(service)?;
        if tail == 0 {
            opts.settings.validate().map_err(DbError::Settings)?;
            // Two nodes creating the log at once both append a genesis
            // record; the first wins and the second is an entry every
            // node rejects as malformed.
            let (c, l, genesis) = (client.clone(), log.clone(), opts.settings.encode());
            rt.run(async move { c.append(&l, genesis).await })?
                .map_err(service)?;
        }
        // The node directory's own checkpoints (node cache and restarts),
        // when on; one whose begin record the log still holds can start
        // the node.
        let store = Arc::new(LogStore::new());
        let mut local = if opts.checkpoint_bytes > 0 || opts.cache_bytes > 0 {
            Some(LocalCheckpoints::open(
                dir,
                url,
                opts.segment_bytes,
                store.clone(),
            )?)
        } else {
            None
        };
        let have = local
            .as_ref()
            .and_then(LocalCheckpoints::newest_begin)
            .filter(|b| *b >= first);
        // The latest published checkpoint newer than that, if any: the
        // node melds the log from the entry after its begin record instead
        // of from genesis.
        let (c, l) = (client.clone(), log.clone());
        let (published, mut skipped) = rt
            .run(async move { self::published::latest(&c, &l, have).await })?
            .map_err(service)?;
        let mut joined = published.as_ref().map(|(p, _)| p.begin);
        let mut from_local = false;
        let published = match (published, have, local.as_mut()) {
            (None, Some(_), Some(lc)) => {
                match lc.load_newest(first, None, opts.cache_bytes, &mut skipped) {
                    Some(l) if begins_here(&rt, &client, &log, l.begin, &l.loaded)? => {
                        joined = Some(l.begin);
                        from_local = true;
                        Some(l.loaded)
                    }
                    Some(l) => {
                        skipped.push(format!(
                            "{}: the checkpoint begun at {} is of another log",
                            self::local::DIR_NAME,
                            l.begin
                        ));
                        None
                    }
                    None => None,
                }
            }
            (p, _, _) => p.map(|(_, loaded)| loaded),
        };
        // The directory's checkpoint did not start the node: the published
        // ones it skipped as older may still.
        let published = match published {
            None if have.is_some() => {
                let (c, l) = (client.clone(), log.clone());
                let (p, more) = rt
                    .run(async move { self::published::latest(&c, &l, None).await })?
                    .map_err(service)?;
                skipped.extend(more);
                joined = p.as_ref().map(|(p, _)| p.begin);
                p.map(|(_, loaded)| loaded)
            }
            p => p,
        };
        let melder = match published {
            Some(loaded) => Melder::from_checkpoint(loaded),
            None if first > 0 => {
                return Err(DbError::Unrecoverable {
                    path: url.into(),
                    cause: Unrecoverable::NoCheckpoint {
                        first,
                        tried: skipped,
                    },
                });
            }
            None => {
                let (c, l) = (client.clone(), log.clone());
                let genesis = rt
                    .run(async move { c.read(&l, 0).await })?
                    .map_err(service)?;
                Melder::from_genesis(&genesis).map_err(|source| DbError::NotADatabase {
                    path: url.into(),
                    source,
                })?
            }
        };
        let settings = *melder.settings();
        let publish_every = if opts.publish_checkpoints {
            if self::published::companion(&log).is_none() {
                return Err(DbError::BadUrl {
                    url: url.to_string(),
                    why: "a node that publishes checkpoints needs a log name of at most 59 \
                          characters (its companion log adds `.ckpt`)",
                });
            }
            Some(opts.checkpoint_bytes.max(1))
        } else {
            None
        };
        let state = initial_state(&melder)?;
        let follow = Arc::new(Follow::new(state, melder.next_pos(), publish_every, feeds));
        let rt = Arc::new(rt);
        let local_shared = Arc::new(LocalShared::default());
        local_shared.cache().budget = opts.cache_bytes;
        let (checkpointer, cache) = match local {
            Some(lc) => {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                let (sh, part_bytes) = (local_shared.clone(), opts.checkpoint_part_bytes);
                let t = std::thread::Builder::new()
                    .name("melddb-local-checkpoint".into())
                    .spawn(move || self::cache::checkpointer(lc, settings, part_bytes, rx, sh))
                    .map_err(|e| DbError::thread("local checkpoint", e))?;
                let side = CacheSide {
                    states: tx,
                    shared: local_shared.clone(),
                    store: store.clone(),
                    every: opts.checkpoint_bytes,
                    bare_after: opts
                        .checkpoint_bytes
                        .saturating_mul(2)
                        .saturating_add(rand::random_range(0..=opts.checkpoint_bytes)),
                    budget: opts.cache_bytes,
                    appender: publish_every
                        .is_none()
                        .then(|| (rt.clone(), client.clone(), log.clone())),
                    since: 0,
                    measured: 0,
                    grown: 0,
                    loaded_at: 0,
                    known: Vec::new(),
                    pressure: false,
                    begin_asked: false,
                };
                (Some(t), Some(side))
            }
            None => (None, None),
        };
        let follower = {
            let (rt, follow, log, url) = (rt.clone(), follow.clone(), log.clone(), url.to_string());
            std::thread::Builder::new()
                .name("melddb-follow".into())
                .spawn(move || {
                    self::follow::follow(&rt, &stream, &url, &log, melder, &follow, cache)
                })
                .map_err(|e| DbError::thread("roll-forward", e))?
        };
        let publisher = match publish_every {
            Some(_) => {
                let p = self::publish::Publisher {
                    rt: rt.clone(),
                    client: client.clone(),
                    log: log.clone(),
                    settings,
                    follow: follow.clone(),
                    part_bytes: opts.checkpoint_part_bytes,
                    trim: opts.trim_log,
                    // A checkpoint of the node's own directory may be newer
                    // than every published one: never trim below it.
                    previous: joined.filter(|_| !from_local),
                };
                match std::thread::Builder::new()
                    .name("melddb-publish".into())
                    .spawn(move || p.run())
                {
                    Ok(t) => Some(t),
                    Err(e) => {
                        // The roll-forward thread is running: stop it.
                        follow.stop();
                        let _ = follower.join();
                        return Err(DbError::thread("publishing", e));
                    }
                }
            }
            None => None,
        };
        let node = Remote {
            url: url.to_string(),
            log,
            settings,
            rt,
            client,
            follow,
            follower: Some(follower),
            publisher,
            recovery: Recovery {
                records: 0,
                torn_bytes: 0,
                elapsed: Duration::ZERO,
                checkpoint: joined,
                local_checkpoint: from_local,
                replayed: 0,
                skipped_checkpoints: skipped,
            },
            local: local_shared,
            store,
            checkpointer,
            max_in_flight: opts.max_in_flight.max(1),
            commit_timeout: opts.commit_timeout,
            _lock: lock,
        };
        // Up to date before the first transaction: every entry the log
        // held when the node connected is melded.
        let (c, l) = (node.client.clone(), node.log.clone());
        let (_, tail) = node
            .rt
            .run(async move { c.bounds(&l).await })?
            .map_err(service)?;
        node.wait_melded(tail)?;
        let mut node = node;
        let st = node.follow.lock();
        node.recovery.records = st.entries;
        node.recovery.replayed = st.entries;
        drop(st);
        node.recovery.elapsed = started.elapsed();
        Ok(node)
    }

    /// The log's settings (its genesis record).
    pub(crate) fn settings(&self) -> Settings {
        self.settings
    }

    /// What connecting did.
    pub(crate) fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The latest state this node has melded.
    pub(crate) fn latest(&self) -> MeldState {
        self.follow.latest()
    }

    /// Waits until this node has melded every entry before `tail`.
    pub(crate) fn wait_melded(&self, tail: LogPos) -> Result<(), DbError> {
        let mut st = self.follow.lock();
        while st.next < tail {
            if let Some(e) = st.stopped() {
                return Err(e);
            }
            st = self
                .follow
                .melded
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    /// Waits until this node has melded everything the service had
    /// acknowledged when this call began (an up-to-date read: it sees every
    /// commit answered anywhere before it).
    pub(crate) fn sync_with_log(&self) -> Result<(), DbError> {
        let (c, l) = (self.client.clone(), self.log.clone());
        let (_, tail) = self
            .rt
            .run(async move { c.bounds(&l).await })?
            .map_err(|e| self.service(e))?;
        self.wait_melded(tail)
    }

    fn service(&self, e: melddb_log::ClientError) -> DbError {
        DbError::Service {
            url: self.url.clone(),
            source: e,
        }
    }

    /// Appends an intention; the handle waits for its outcome.
    pub(crate) fn submit(
        &self,
        bytes: Vec<u8>,
        local: LocalIntention,
    ) -> Result<RemoteHandle, DbError> {
        let started = Instant::now();
        let deadline = self.commit_timeout.map(|t| (started + t, t));
        let floor = {
            let mut st = self.follow.lock();
            // Back-pressure: at most `max_in_flight` commits appended and
            // not melded by this node.
            while st.in_flight() >= self.max_in_flight {
                if let Some(e) = st.stopped() {
                    return Err(e);
                }
                st = self
                    .follow
                    .melded
                    .wait_timeout(st, Duration::from_millis(10))
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
            if let Some(e) = st.stopped() {
                return Err(e);
            }
            st.enter()
        };
        let (c, l) = (self.client.clone(), self.log.clone());
        let limit = deadline.map(|(at, _)| at.saturating_duration_since(Instant::now()));
        let appended = self.rt.run(async move {
            match limit {
                // The client retries an append across reconnections; past
                // the deadline the commit gives up (it may still land).
                Some(limit) => tokio::time::timeout(limit, c.append(&l, bytes)).await.ok(),
                None => Some(c.append(&l, bytes).await),
            }
        })?;
        let Some(appended) = appended else {
            self.follow.lock().not_sent(floor);
            return Err(DbError::TimedOut {
                pos: None,
                seconds: self.commit_timeout.unwrap_or_default().as_secs_f64(),
            });
        };
        match appended {
            Ok(pos) => {
                self.follow.lock().landed(floor, pos, local);
                Ok(RemoteHandle {
                    pos,
                    follow: self.follow.clone(),
                    rt: self.rt.clone(),
                    client: self.client.clone(),
                    log: self.log.clone(),
                    group_meld: self.settings.group_meld,
                    done: false,
                    deadline,
                })
            }
            Err(e) => {
                self.follow.lock().not_sent(floor);
                Err(self.service(e))
            }
        }
    }

    /// The node cache's figures (its store reads from the node
    /// directory's checkpoints).
    pub(crate) fn cache_stats(&self) -> CacheStats {
        let mut c = self.local.cache().clone();
        c.store = self.store.stats();
        c
    }

    /// The log as this node sees it, and the checkpoints it published.
    pub(crate) fn log_stats(&self) -> LogStats {
        let (local_last, local_written, local_error) = {
            let l = self.local.status();
            (
                l.last.clone(),
                l.written,
                l.error.as_ref().map(ToString::to_string),
            )
        };
        let st = self.follow.lock();
        let p = &st.published;
        LogStats {
            first: p.first,
            tail: st.next,
            synced: st.next,
            bytes: st.bytes,
            last_checkpoint: p.last.clone(),
            checkpoints_written: p.written,
            trims: p.trims,
            checkpoint_error: p.error.as_ref().map(ToString::to_string),
            bytes_appended: 0,
            rejoins: st.rejoins,
            local_checkpoint: local_last,
            local_checkpoints_written: local_written,
            local_checkpoint_error: local_error,
        }
    }

    /// Publishes a checkpoint of a state that holds every commit answered
    /// anywhere before this call, and waits for it (a node with
    /// `publish_checkpoints` only).
    pub(crate) fn checkpoint(&self) -> Result<CheckpointInfo, DbError> {
        if self.publisher.is_none() {
            return Err(DbError::Unsupported(
                Unsupported::CheckpointWithoutPublishing,
            ));
        }
        self.sync_with_log()?;
        let deadline = Instant::now() + self::publish::CHECKPOINT_WAIT;
        let mut st = self.follow.lock();
        // A checkpoint begun at or after this position holds them all; an
        // error counts only from a publish begun after this call.
        let want = st.next;
        let attempts = st.published.attempts;
        loop {
            if let Some(info) = st.published.last.as_ref().filter(|c| c.first >= want) {
                return Ok(info.clone());
            }
            if let Some(e) = st
                .published
                .error
                .as_ref()
                .filter(|_| st.published.error_attempt > attempts)
            {
                return Err(e.clone());
            }
            if let Some(e) = st.stopped() {
                return Err(e);
            }
            if Instant::now() >= deadline {
                return Err(DbError::Checkpoint(CheckpointFailure::TimedOut {
                    seconds: self::publish::CHECKPOINT_WAIT.as_secs(),
                }));
            }
            if !st.publishing && !st.due {
                st.due = true;
                self.follow.melded.notify_all();
            }
            st = self
                .follow
                .melded
                .wait_timeout(st, Duration::from_millis(50))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Stops following the log (commits in flight fail with
    /// [`DbError::Stopped`]).
    pub(crate) fn close(&mut self) -> Result<(), DbError> {
        self.follow.stop();
        // Both joined whatever either did.
        let publisher = self.publisher.take().map(JoinHandle::join);
        let follower = self.follower.take().map(JoinHandle::join);
        // Ends once the roll-forward thread dropped its sender.
        let checkpointer = self.checkpointer.take().map(JoinHandle::join);
        if let Some(Err(_)) = checkpointer {
            return Err(DbError::Internal("the local checkpoint thread panicked"));
        }
        if let Some(Err(_)) = publisher {
            return Err(DbError::Internal("the publishing thread panicked"));
        }
        if let Some(Err(_)) = follower {
            return Err(DbError::Internal("the roll-forward thread panicked"));
        }
        Ok(())
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl RemoteHandle {
    /// The entry's position in the log.
    pub(crate) fn pos(&self) -> LogPos {
        self.pos
    }

    /// Waits until this node has melded the entry and returns its outcome.
    pub(crate) fn wait(mut self) -> Result<Outcome, DbError> {
        let result = self.wait_inner();
        self.follow.lock().settle(self.pos);
        self.done = true;
        result
    }

    fn wait_inner(&self) -> Result<Outcome, DbError> {
        let mut closed_pair = false;
        let mut since = Instant::now();
        let mut st = self.follow.lock();
        loop {
            if let Some(o) = st.take_outcome(self.pos) {
                return Ok(o);
            }
            if st.skipped(self.pos) {
                return Err(DbError::OutcomeUnknown { pos: self.pos });
            }
            if let Some(e) = st.stopped() {
                return Err(e);
            }
            if let Some((_, limit)) = self.deadline.filter(|(at, _)| Instant::now() >= *at) {
                return Err(DbError::TimedOut {
                    pos: Some(self.pos),
                    seconds: limit.as_secs_f64(),
                });
            }
            let pair_open = self.group_meld && st.next == self.pos + 1 && st.lcs < self.pos;
            if pair_open && !closed_pair && since.elapsed() >= PAIR_WAIT {
                drop(st);
                // A failed filler is not this commit's failure: another
                // entry may still close the pair; try again later.
                let (c, l) = (self.client.clone(), self.log.clone());
                closed_pair = matches!(
                    self.rt.run(async move { c.append(&l, Vec::new()).await }),
                    Ok(Ok(_))
                );
                since = Instant::now();
                st = self.follow.lock();
                continue;
            }
            st = self
                .follow
                .melded
                .wait_timeout(st, PAIR_WAIT)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for RemoteHandle {
    fn drop(&mut self) {
        if !self.done {
            self.follow.lock().settle(self.pos);
        }
    }
}

/// Whether the shared log's entry at `begin` is a checkpoint begin record
/// of the database `loaded` belongs to (a node directory's checkpoint is
/// only used on the log it was written from).
fn begins_here(
    rt: &Rt,
    client: &Client,
    log: &str,
    begin: LogPos,
    loaded: &melddb::checkpoint::Loaded,
) -> Result<bool, DbError> {
    let (c, l) = (client.clone(), log.to_string());
    let Ok(rec) = rt.run(async move { c.read(&l, begin).await })? else {
        return Ok(false);
    };
    Ok(matches!(
        melddb::checkpoint::parse_record(&rec),
        Ok(melddb::checkpoint::Record::Begin { db_id }) if db_id == loaded.settings.db_id
    ))
}

/// The state after the genesis record.
fn initial_state(melder: &Melder) -> Result<MeldState, DbError> {
    melder
        .meld_state(melder.lcs().pos())
        .cloned()
        .ok_or(DbError::Internal("no state after the genesis record"))
}

/// Whether `s` names a log on the service (`melddb://…`) rather than a
/// directory.
pub fn is_log_url(s: &str) -> bool {
    s.starts_with(SCHEME)
}
