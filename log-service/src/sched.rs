//! Real-time scheduling for the threads on the append path
//! ([`crate::config::Config::realtime_priority`]).
//!
//! On a busy host an ordinary writer thread can wait for a core behind
//! the network threads and the clients; every append taken into its batch
//! waits with it. SCHED_FIFO lets the writer and the fsync helpers run as
//! soon as they are ready (docs/benchmarks-log-history.md has the measured
//! effect).

use std::sync::atomic::Ordering;

use crate::store::Shared;

/// Highest SCHED_FIFO priority Linux accepts.
pub(crate) const MAX_PRIORITY: u8 = 99;

/// Gives the calling thread the configured real-time priority, if any.
/// Refusal (no CAP_SYS_NICE, a low RLIMIT_RTPRIO, another OS) is a warning,
/// not an error: the thread then runs as an ordinary one. Counts the
/// threads that got it in the `realtime_threads` stat.
pub(crate) fn make_realtime(shared: &Shared, what: &str) {
    let priority = shared.config.realtime_priority;
    if priority == 0 {
        return;
    }
    match set_fifo(priority) {
        Ok(()) => {
            shared
                .counters
                .realtime_threads
                .fetch_add(1, Ordering::Relaxed);
        }
        Err(why) => tracing::warn!(
            thread = what,
            priority,
            error = %why,
            "could not make the thread real-time (needs CAP_SYS_NICE or `ulimit -r {priority}`); it runs as an ordinary thread"
        ),
    }
}

#[cfg(target_os = "linux")]
fn set_fifo(priority: u8) -> Result<(), String> {
    use thread_priority::{
        set_thread_priority_and_policy, thread_native_id, RealtimeThreadSchedulePolicy,
        ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
    };
    let value = ThreadPriorityValue::try_from(priority).map_err(|e| e.to_string())?;
    set_thread_priority_and_policy(
        thread_native_id(),
        ThreadPriority::Crossplatform(value),
        ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
    )
    .map_err(|e| format!("{e:?}"))
}

#[cfg(not(target_os = "linux"))]
fn set_fifo(_priority: u8) -> Result<(), String> {
    Err("real-time priority is implemented for Linux only".into())
}
