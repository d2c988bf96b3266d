//! The binding's API as Swift and Kotlin see it, driven from Rust: a
//! model map for ranges, a conflict's outcome, `transact` with a body that
//! conflicts and one that throws, the watch and its handle, async calls
//! (also dropped before they finish) and typed errors.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use melddb_ffi::{
    ChangeListener, Commit, CommitOutcome, Database, Isolation, MeldError, Transaction,
    TransactionBody,
};

fn open() -> (tempfile::TempDir, Arc<Database>) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path().to_string_lossy().into_owned()).unwrap();
    (dir, db)
}

struct Body<F: Fn(&Transaction) -> Result<(), MeldError> + Send + Sync>(F);

impl<F: Fn(&Transaction) -> Result<(), MeldError> + Send + Sync> TransactionBody for Body<F> {
    fn run(&self, tx: Arc<Transaction>) -> Result<(), MeldError> {
        (self.0)(&tx)
    }
}

fn body(
    f: impl Fn(&Transaction) -> Result<(), MeldError> + Send + Sync + 'static,
) -> Arc<dyn TransactionBody> {
    Arc::new(Body(f))
}

fn collect(it: &melddb_ffi::RangeIterator) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(kv) = it.next().unwrap() {
        out.push((kv.key, kv.value));
    }
    out
}

#[test]
fn ranges_agree_with_a_model_map_across_chunks() {
    let (_dir, db) = open();
    let mut model = BTreeMap::new();
    let tx = db.begin(Isolation::Serializable).unwrap();
    for i in 0..700u32 {
        let k = format!("k/{:04}", (i * 7919) % 1000).into_bytes();
        let v = format!("v{i}").into_bytes();
        tx.put(k.clone(), v.clone()).unwrap();
        model.insert(k, v);
    }
    assert!(matches!(
        db.commit_blocking(tx).unwrap(),
        CommitOutcome::Committed { .. }
    ));
    let read = db.begin_read().unwrap();
    let all: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(collect(&read.clone().range(None, None, false, None)), all);
    let mut rev = all.clone();
    rev.reverse();
    assert_eq!(collect(&read.clone().range(None, None, true, None)), rev);
    let (s, e) = (b"k/0100".to_vec(), b"k/0600".to_vec());
    let want: Vec<_> = model
        .range(s.clone()..e.clone())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(
        collect(
            &read
                .clone()
                .range(Some(s.clone()), Some(e.clone()), false, None)
        ),
        want
    );
    assert_eq!(
        collect(&read.clone().range(Some(s), Some(e), false, Some(300))),
        want[..300].to_vec()
    );
    assert_eq!(
        collect(&read.clone().prefix(b"k/09".to_vec())).len(),
        model.keys().filter(|k| k.starts_with(b"k/09")).count()
    );
    // A transaction's range sees its own writes.
    let tx = db.begin(Isolation::Serializable).unwrap();
    tx.put(b"k/0000a".to_vec(), b"mine".to_vec()).unwrap();
    let mine = collect(&tx.clone().prefix(b"k/0000".to_vec()));
    assert_eq!(mine.len(), 2);
    // Reversed, bounded and limited, across chunks, in the transaction.
    let mut with_mine = model.clone();
    with_mine.insert(b"k/0000a".to_vec(), b"mine".to_vec());
    let want: Vec<_> = with_mine
        .range(b"k/0000".to_vec()..b"k/0900".to_vec())
        .rev()
        .take(500)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let got = collect(&tx.clone().range(
        Some(b"k/0000".to_vec()),
        Some(b"k/0900".to_vec()),
        true,
        Some(500),
    ));
    assert_eq!(got, want);
    assert_eq!(read.get(b"k/0000a".to_vec()).unwrap(), None);
}

#[test]
fn a_conflict_aborts_with_its_reason_and_key_and_transact_retries_it() {
    let (_dir, db) = open();
    db.transact_blocking(
        Isolation::Serializable,
        body(|tx| tx.put(b"n".to_vec(), b"0".to_vec())),
    )
    .unwrap();
    let a = db.begin(Isolation::Serializable).unwrap();
    let seen = a.get(b"n".to_vec()).unwrap().unwrap();
    let b = db.begin(Isolation::Serializable).unwrap();
    b.put(b"n".to_vec(), b"1".to_vec()).unwrap();
    assert!(matches!(
        db.commit_blocking(b).unwrap(),
        CommitOutcome::Committed { .. }
    ));
    a.put(b"n".to_vec(), [seen, b"+".to_vec()].concat())
        .unwrap();
    match db.commit_blocking(a.clone()).unwrap() {
        CommitOutcome::Aborted { reason, key, .. } => {
            assert_eq!(reason, "WriteWrite");
            assert_eq!(key.as_deref(), Some(&b"n"[..]));
        }
        other => panic!("expected an abort, got {other:?}"),
    }
    // A committed transaction is finished.
    assert!(matches!(a.get(b"n".to_vec()), Err(MeldError::State { .. })));

    // transact: the first attempt of the body loses to a commit made
    // inside it, the second wins; the count is exact.
    let tries = Arc::new(Mutex::new(0));
    let (db2, t2) = (db.clone(), tries.clone());
    let out = db
        .transact_blocking(
            Isolation::Serializable,
            body(move |tx| {
                let n: u32 = String::from_utf8(tx.get(b"n".to_vec())?.unwrap())
                    .unwrap()
                    .parse()
                    .unwrap();
                let mut t = t2.lock().unwrap();
                *t += 1;
                if *t == 1 {
                    let other = db2.begin(Isolation::Serializable)?;
                    other.put(b"n".to_vec(), (n + 10).to_string().into_bytes())?;
                    db2.commit_blocking(other)?;
                }
                tx.put(b"n".to_vec(), (n + 1).to_string().into_bytes())
            }),
        )
        .unwrap();
    assert!(matches!(out, CommitOutcome::Committed { .. }));
    assert_eq!(*tries.lock().unwrap(), 2);
    assert_eq!(db.get(b"n".to_vec()).unwrap().as_deref(), Some(&b"12"[..]));

    // A body that throws commits nothing and its error comes back.
    let err = db
        .transact_blocking(
            Isolation::Serializable,
            body(|tx| {
                tx.put(b"n".to_vec(), b"lost".to_vec())?;
                Err(MeldError::Callback {
                    detail: "changed my mind".into(),
                })
            }),
        )
        .unwrap_err();
    assert!(matches!(err, MeldError::Callback { ref detail } if detail == "changed my mind"));
    assert_eq!(db.get(b"n".to_vec()).unwrap().as_deref(), Some(&b"12"[..]));
}

struct Recorder(Mutex<Vec<Commit>>, Mutex<Option<MeldError>>);

impl ChangeListener for Recorder {
    fn on_commit(&self, commit: Commit) -> Result<(), MeldError> {
        self.0.lock().unwrap().push(commit);
        Ok(())
    }
    fn on_end(&self, error: MeldError) {
        *self.1.lock().unwrap() = Some(error);
    }
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_watch_delivers_commits_under_its_prefix_until_its_handle_is_dropped() {
    let (_dir, db) = open();
    let rec = Arc::new(Recorder(Mutex::new(Vec::new()), Mutex::new(None)));
    let handle = db.watch(b"user/".to_vec(), rec.clone()).unwrap();
    let put = |k: &'static [u8]| {
        db.transact_blocking(
            Isolation::Serializable,
            body(move |tx| tx.put(k.to_vec(), b"v".to_vec())),
        )
        .unwrap()
    };
    put(b"user/ann");
    put(b"other");
    put(b"user/bo");
    wait_until("two commits", || rec.0.lock().unwrap().len() == 2);
    let keys: Vec<_> = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.changes[0].key.clone())
        .collect();
    assert_eq!(keys, [b"user/ann".to_vec(), b"user/bo".to_vec()]);
    drop(handle);
    std::thread::sleep(Duration::from_millis(200));
    put(b"user/cy");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        rec.0.lock().unwrap().len(),
        2,
        "no call after the handle is gone"
    );
}

struct Failing(Mutex<u32>, Mutex<Option<MeldError>>);

impl ChangeListener for Failing {
    fn on_commit(&self, _: Commit) -> Result<(), MeldError> {
        *self.0.lock().unwrap() += 1;
        Err(MeldError::Argument {
            detail: "listener broke".into(),
        })
    }
    fn on_end(&self, error: MeldError) {
        *self.1.lock().unwrap() = Some(error);
    }
}

#[test]
fn a_listener_that_fails_ends_its_watch_with_a_callback_error() {
    let (_dir, db) = open();
    let rec = Arc::new(Failing(Mutex::new(0), Mutex::new(None)));
    let _handle = db.watch(b"".to_vec(), rec.clone()).unwrap();
    for k in [&b"a"[..], b"b"] {
        db.transact_blocking(
            Isolation::Serializable,
            body(move |tx| tx.put(k.to_vec(), b"v".to_vec())),
        )
        .unwrap();
    }
    wait_until("the end of the watch", || rec.1.lock().unwrap().is_some());
    assert!(
        matches!(rec.1.lock().unwrap().clone(), Some(MeldError::Callback { ref detail }) if detail.contains("listener broke"))
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(*rec.0.lock().unwrap(), 1, "no call after the failure");
}

/// Polls a future to completion on this thread (the foreign executor's
/// part, as simple as it gets).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

#[test]
fn async_calls_answer_and_a_dropped_one_is_harmless() {
    let (_dir, db) = open();
    let tx = db.begin(Isolation::Serializable).unwrap();
    tx.put(b"k".to_vec(), b"v".to_vec()).unwrap();
    let out = block_on(db.clone().commit(tx)).unwrap();
    assert!(matches!(out, CommitOutcome::Committed { .. }));
    // A commit future dropped after one poll: the commit still finishes on
    // its thread, and the database goes on.
    let tx = db.begin(Isolation::Serializable).unwrap();
    tx.put(b"dropped".to_vec(), b"1".to_vec()).unwrap();
    {
        let fut = db.clone().commit(tx);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut fut = std::pin::pin!(fut);
        let _ = fut.as_mut().poll(&mut cx);
    }
    wait_until("the dropped commit", || {
        db.get(b"dropped".to_vec()).unwrap().is_some()
    });
    block_on(db.clone().sync_with_log()).unwrap();
    let read = block_on(db.clone().begin_read_latest()).unwrap();
    assert_eq!(read.get(b"k".to_vec()).unwrap().as_deref(), Some(&b"v"[..]));
    let out = block_on(db.clone().transact(
        Isolation::Snapshot,
        body(|tx| tx.put(b"t".to_vec(), b"1".to_vec())),
    ))
    .unwrap();
    assert!(matches!(out, CommitOutcome::Committed { .. }));
}

#[test]
fn errors_are_typed() {
    let (dir, db) = open();
    let tx = db.begin(Isolation::Serializable).unwrap();
    assert!(matches!(
        tx.put(vec![0; 5000], b"v".to_vec()),
        Err(MeldError::Argument { .. })
    ));
    assert!(matches!(
        db.get(vec![0; 5000]),
        Err(MeldError::Argument { .. })
    ));
    let read = db.begin_read().unwrap();
    assert!(matches!(
        read.get(vec![0; 5000]),
        Err(MeldError::Argument { .. })
    ));
    assert!(matches!(
        read.clone()
            .range(Some(vec![0; 5000]), None, false, None)
            .next(),
        Err(MeldError::Argument { .. })
    ));
    // The directory is locked while open.
    assert!(matches!(
        Database::open(dir.path().to_string_lossy().into_owned()),
        Err(MeldError::Storage { .. })
    ));
    assert!(matches!(
        Database::connect(
            "http://nowhere/x".into(),
            dir.path().join("n").to_string_lossy().into_owned(),
            None
        ),
        Err(MeldError::Argument { .. })
    ));
    db.shutdown().unwrap();
    assert!(matches!(
        db.get(b"k".to_vec()),
        Err(MeldError::State { .. })
    ));
    assert!(matches!(
        db.begin(Isolation::Serializable),
        Err(MeldError::State { .. })
    ));
    // Objects taken before the close keep their own state.
    assert_eq!(read.get(b"k".to_vec()).unwrap(), None);
    db.shutdown().unwrap();
}
