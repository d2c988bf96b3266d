//! Taking the service's locks past poisoning, the same way everywhere.
//!
//! A lock is poisoned when a thread panics while holding it. Every
//! critical section in this crate leaves its data consistent between
//! statements that can panic, so the data is used as it stands: one panic
//! (a bug elsewhere) must not turn every later request into another.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `l`, poisoned or not.
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `l`, poisoned or not.
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisoned_locks_still_hand_out_their_data() {
        let m = std::sync::Arc::new(Mutex::new(vec![7u64]));
        let l = std::sync::Arc::new(RwLock::new(vec![7u64]));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _m = m2.lock().unwrap();
            let _l = l2.write().unwrap();
            panic!("poison both locks on purpose");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        lock(&m).push(8);
        write(&l).push(8);
        assert_eq!(*lock(&m), [7, 8]);
        assert_eq!(*read(&l), [7, 8]);
    }
}
