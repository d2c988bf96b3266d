//! Transparent huge pages off for the service's process, when asked
//! ([`crate::config::Tuning::disable_transparent_huge_pages`]; off by
//! default, since it is a process-wide setting).
//!
//! With THP, the first touch of a 2 MiB region faults in (and zeroes) a
//! whole huge page at once. The index grows by about 5 MB a second at
//! 150K appends/s, so the writer meets such a fault two or three times a
//! second, each holding it (and every append in its batch) for
//! milliseconds (docs/benchmarks.md); with 4 KiB pages the same memory
//! arrives in faults of a few microseconds each. Databases that care
//! about tail latency commonly turn THP off for the same reason.

/// Turns THP off for the whole process (`prctl(PR_SET_THP_DISABLE)`; it
/// is per process, not per thread, and children inherit it). Memory
/// already mapped with huge pages keeps them. A refusal is logged, not an
/// error: the service then runs with the system's THP setting.
pub(crate) fn disable() {
    if let Err(why) = set_disabled() {
        tracing::warn!(error = %why, "could not turn transparent huge pages off for this process; latency may suffer from huge-page faults");
    }
}

/// Whether THP is off for this process, by this service or by whoever
/// started it (`false` where the OS has no such switch).
pub(crate) fn disabled() -> bool {
    #[cfg(target_os = "linux")]
    {
        rustix::thread::transparent_huge_pages_are_disabled().unwrap_or(false)
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(target_os = "linux")]
fn set_disabled() -> Result<(), String> {
    rustix::thread::disable_transparent_huge_pages(true).map_err(|e| e.to_string())
}

#[cfg(not(target_os = "linux"))]
fn set_disabled() -> Result<(), String> {
    // Nothing to turn off: other systems have no transparent huge pages
    // in this sense.
    Ok(())
}
