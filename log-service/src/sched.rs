//! Scheduling for the threads on the append path: real-time priority
//! ([`crate::config::Config::realtime_priority`]), a short time slice
//! ([`crate::config::Config::slice_us`]) and a CPU of the writer's own
//! ([`crate::config::Config::writer_cpu`]).
//!
//! On a busy host an ordinary writer thread can wait for a core behind
//! the network threads and the clients; every append taken into its batch
//! waits with it. SCHED_FIFO lets the writer and the fsync helpers run as
//! soon as they are ready (docs/benchmarks-log-history.md has the measured
//! effect). Pinning gets most of that without privileges: with the
//! writer alone on its CPU, the threads it wakes (the helpers, the
//! network threads answering) run on the others instead of preempting it
//! (docs/benchmarks.md, thirty-eighth session). A short slice needs
//! neither privileges nor a spare CPU: Linux's EEVDF scheduler (6.12 and
//! later) lets a waking thread whose slice is shorter than the running
//! one's preempt it, so the writer and the helpers run soon after they
//! wake instead of waiting out the running thread's slice (measured in
//! the thirty-ninth session; no clear p99 gain there, so it is off by
//! default).

use std::sync::atomic::Ordering;

use crate::config::Config;
use crate::store::Shared;

/// What a thread of the store does, for where it runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The writer: real-time if configured, on `writer_cpu` if set.
    Writer,
    /// An fsync helper or the `io_uring` thread: real-time if
    /// configured, off `writer_cpu`.
    Round,
    /// Background work (the spares refill): off `writer_cpu`.
    Background,
}

/// Gives the calling thread the scheduling its role has in `shared`'s
/// configuration. Refusals are warnings: the thread runs as it was.
pub(crate) fn settle(shared: &Shared, what: &str, role: Role) {
    if role != Role::Background {
        make_realtime(shared, what);
        shorten_slice(shared, what);
    }
    if let Some(p) = &shared.pinning {
        match p.apply(role == Role::Writer) {
            Ok(()) => {
                shared
                    .counters
                    .pinned_threads
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(
                thread = what,
                writer_cpu = p.writer,
                error = %e,
                "could not place the thread on or off the writer's CPU; it runs where it was"
            ),
        }
    }
}

/// The CPUs of a store whose writer has one to itself.
#[derive(Clone, Copy)]
pub(crate) struct Pinning {
    /// The writer's CPU.
    pub writer: usize,
    /// The CPUs the process may run on (its main thread's, at the
    /// open), but the writer's.
    #[cfg(target_os = "linux")]
    others: rustix::thread::CpuSet,
}

impl Pinning {
    /// Checks `config.writer_cpu` against the CPUs the process may run on
    /// (its main thread's affinity: the thread that opens the store may
    /// be one kept off the writer's CPU already): `None` when unset; an
    /// error saying which CPUs there are when the writer's is not among
    /// them or is the only one.
    pub(crate) fn from_config(config: &Config) -> Result<Option<Pinning>, String> {
        let Some(cpu) = config.writer_cpu else {
            return Ok(None);
        };
        Self::check(cpu).map(Some)
    }

    #[cfg(target_os = "linux")]
    fn check(cpu: usize) -> Result<Pinning, String> {
        let allowed = rustix::thread::sched_getaffinity(Some(rustix::process::getpid()))
            .map_err(|e| format!("writer_cpu {cpu}: cannot read this process's CPUs: {e}"))?;
        let list: Vec<String> = (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| allowed.is_set(c))
            .map(|c| c.to_string())
            .collect();
        let list = list.join(", ");
        if cpu >= rustix::thread::CpuSet::MAX_CPU || !allowed.is_set(cpu) {
            return Err(format!(
                "writer_cpu {cpu} is not a CPU this process may run on (it may use {list}): pick one of those, or leave writer_cpu unset"
            ));
        }
        if allowed.count() < 2 {
            return Err(format!(
                "writer_cpu {cpu} is the only CPU this process may run on: the writer needs another for the threads it wakes; leave writer_cpu unset"
            ));
        }
        let mut others = allowed;
        others.unset(cpu);
        Ok(Pinning {
            writer: cpu,
            others,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn check(cpu: usize) -> Result<Pinning, String> {
        Err(format!(
            "writer_cpu {cpu}: pinning the writer is implemented for Linux only; leave writer_cpu unset"
        ))
    }

    /// Runs the calling thread on the writer's CPU (`writer`) or on the
    /// others.
    #[cfg(target_os = "linux")]
    fn apply(&self, writer: bool) -> std::io::Result<()> {
        let set = if writer {
            let mut one = rustix::thread::CpuSet::new();
            one.set(self.writer);
            one
        } else {
            self.others
        };
        rustix::thread::sched_setaffinity(None, &set).map_err(std::io::Error::from)
    }

    #[cfg(not(target_os = "linux"))]
    fn apply(&self, _writer: bool) -> std::io::Result<()> {
        Err(std::io::Error::other("Linux only"))
    }
}

/// Keeps the calling thread off `cpu`, on the other CPUs it may run on:
/// for a program that embeds a store opened with `writer_cpu` and wants
/// its own busy threads (a runtime's workers, clients) away from the
/// writer, as `melddb-log serve` does with its network threads. An error
/// when `cpu` is the only CPU left to it, or the system refuses; Linux
/// only.
#[cfg(target_os = "linux")]
pub fn keep_off_cpu(cpu: usize) -> std::io::Result<()> {
    let mut set = rustix::thread::sched_getaffinity(None)?;
    if cpu < rustix::thread::CpuSet::MAX_CPU {
        set.unset(cpu);
    }
    if set.count() == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is the only one this thread may run on"),
        ));
    }
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// Keeps the calling thread off `cpu` (Linux only: an error here).
#[cfg(not(target_os = "linux"))]
pub fn keep_off_cpu(cpu: usize) -> std::io::Result<()> {
    Err(std::io::Error::other(format!(
        "keeping threads off CPU {cpu} is implemented for Linux only"
    )))
}

/// Shortest time slice, in microseconds, Linux gives an ordinary thread
/// (it raises a shorter request to this).
pub(crate) const MIN_SLICE_US: u32 = 100;

/// Longest time slice, in microseconds, Linux gives an ordinary thread.
pub(crate) const MAX_SLICE_US: u32 = 100_000;

/// Gives the calling thread the configured time slice, if any, and counts
/// it in the `short_slice_threads` stat when the kernel reports the slice
/// back. A real-time thread keeps its policy (slices are for ordinary
/// threads), and a kernel without custom slices (before 6.12) accepts the
/// request but ignores it, so neither is counted; a refusal is a warning.
fn shorten_slice(shared: &Shared, what: &str) {
    let us = shared.config.slice_us;
    if us == 0 {
        return;
    }
    match set_slice(us) {
        Ok(true) => {
            shared
                .counters
                .short_slice_threads
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(false) => {}
        Err(why) => tracing::warn!(
            thread = what,
            slice_us = us,
            error = %why,
            "could not shorten the thread's time slice; it runs with the system's"
        ),
    }
}

/// Reads the calling thread's scheduling attributes.
#[cfg(target_os = "linux")]
fn get_attr() -> std::io::Result<libc::sched_attr> {
    let mut attr = libc::sched_attr {
        size: 0,
        sched_policy: 0,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: 0,
        sched_deadline: 0,
        sched_period: 0,
    };
    let size = std::mem::size_of::<libc::sched_attr>() as libc::c_uint;
    // SAFETY: `attr` is a live, writable sched_attr of `size` bytes; the
    // kernel writes at most `size` bytes into it. Thread 0 is the caller.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut libc::sched_attr,
            size,
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr)
}

/// Sets an ordinary thread's slice (`sched_runtime` of SCHED_OTHER or
/// SCHED_BATCH), keeping its policy and nice value. `Ok(true)` when the
/// kernel reports the slice back, `Ok(false)` when the thread is not an
/// ordinary one or the kernel has no custom slices.
#[cfg(target_os = "linux")]
fn set_slice(us: u32) -> Result<bool, String> {
    let mut attr = get_attr().map_err(|e| format!("sched_getattr: {e}"))?;
    let ordinary = [libc::SCHED_OTHER, libc::SCHED_BATCH];
    if !ordinary.contains(&(attr.sched_policy as libc::c_int)) {
        return Ok(false);
    }
    let ns = u64::from(us) * 1_000;
    attr.size = std::mem::size_of::<libc::sched_attr>() as u32;
    attr.sched_flags = 0;
    attr.sched_runtime = ns;
    // SAFETY: `attr` is a complete sched_attr whose `size` says so; the
    // kernel only reads it. Thread 0 is the caller.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            0,
            &attr as *const libc::sched_attr,
            0,
        )
    };
    if r != 0 {
        return Err(format!(
            "sched_setattr: {}",
            std::io::Error::last_os_error()
        ));
    }
    let now = get_attr().map_err(|e| format!("sched_getattr: {e}"))?;
    // The kernel clamps the slice to its range; an old kernel reports 0.
    let want = ns.clamp(
        u64::from(MIN_SLICE_US) * 1_000,
        u64::from(MAX_SLICE_US) * 1_000,
    );
    Ok(now.sched_runtime == want)
}

#[cfg(not(target_os = "linux"))]
fn set_slice(_us: u32) -> Result<bool, String> {
    Err("time slices are implemented for Linux only".into())
}

/// Highest SCHED_FIFO priority Linux accepts.
pub(crate) const MAX_PRIORITY: u8 = 99;

/// Gives the calling thread the configured real-time priority, if any.
/// Refusal (no CAP_SYS_NICE, a low RLIMIT_RTPRIO, another OS) is a warning,
/// not an error: the thread then runs as an ordinary one. Counts the
/// threads that got it in the `realtime_threads` stat.
fn make_realtime(shared: &Shared, what: &str) {
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
