//! `melddb://host:port/LOG`: where a shared log lives.

use super::super::DbError;

/// The scheme of a log on the log service.
pub const SCHEME: &str = "melddb://";

/// A parsed log address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogUrl {
    /// `host:port` of the service's TCP listener.
    pub addr: String,
    /// The log's name on the service.
    pub log: String,
}

impl LogUrl {
    /// Parses `melddb://host:port/LOG`. The log name is what the service
    /// accepts: 1 to 64 ASCII letters, digits, `-`, `_` and `.`.
    pub fn parse(url: &str) -> Result<LogUrl, DbError> {
        let bad = |why: &'static str| DbError::BadUrl {
            url: url.to_string(),
            why,
        };
        let rest = url
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it must start with melddb://"))?;
        let (addr, log) = rest
            .split_once('/')
            .ok_or_else(|| bad("it must name a log: melddb://host:port/LOG"))?;
        let (host, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| bad("the address needs a port: melddb://host:port/LOG"))?;
        if host.is_empty() {
            return Err(bad("the host is empty"));
        }
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(bad("the port must be a number from 1 to 65535"));
        }
        if melddb_log::store::check_log_name(log).is_err() {
            return Err(bad(
                "the log name must be 1 to 64 letters, digits, '-', '_' or '.'",
            ));
        }
        Ok(LogUrl {
            addr: addr.to_string(),
            log: log.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_bad_ones_say_why() {
        let u = LogUrl::parse("melddb://127.0.0.1:7400/bank").unwrap();
        assert_eq!(u.addr, "127.0.0.1:7400");
        assert_eq!(u.log, "bank");
        let u = LogUrl::parse("melddb://[::1]:9/a.b-c_d").unwrap();
        assert_eq!((u.addr.as_str(), u.log.as_str()), ("[::1]:9", "a.b-c_d"));
        for (bad, says) in [
            ("http://h:1/x", "melddb://"),
            ("melddb://h:1", "name a log"),
            ("melddb://h/x", "port"),
            ("melddb://h:0/x", "port"),
            ("melddb://h:99999/x", "port"),
            ("melddb://:1/x", "host"),
            ("melddb://h:1/", "log name"),
            ("melddb://h:1/a/b", "log name"),
        ] {
            let e = LogUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
