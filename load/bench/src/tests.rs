//! The command line: the commands the docs and CI give parse to their
//! suite, and flags a suite does not take are refused.

use clap::{CommandFactory, Parser};

use super::{Cli, Suite};
use melddb_bench::logsvc::PointSpec;

fn parse(line: &str) -> Result<Suite, clap::Error> {
    Cli::try_parse_from(std::iter::once("melddb-bench").chain(line.split_whitespace()))
        .map(|c| c.suite)
}

#[test]
fn the_command_line_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn every_suites_documented_commands_parse() {
    for line in [
        "meld --quick",
        "meld --quick --json m.json",
        "meld --json m.json --plots img",
        "meld --only symmetric:8:16",
        "meld --quick --only symmetric:8:16 --txns 3000 --rounds 3 --seed 7",
    ] {
        assert!(matches!(parse(line), Ok(Suite::Meld(_))), "{line}");
    }
    for line in ["nodes --quick", "nodes --quick --json n.json", "nodes"] {
        assert!(matches!(parse(line), Ok(Suite::Nodes(_))), "{line}");
    }
    assert!(matches!(
        parse("nodes-worker --dir d --log melddb://127.0.0.1:1/x --keys 10 --seconds 1 --mix ro"),
        Ok(Suite::NodesWorker(_))
    ));
    assert!(parse("nodes --point 1x1").is_err());
    for line in [
        "pipeline --quick",
        "pipeline --quick --json p.json --plots img",
        "pipeline --keys 10000000 --zone-min 300 --zone-max 600 --txns 100",
    ] {
        assert!(matches!(parse(line), Ok(Suite::Pipeline(_))), "{line}");
    }
    for line in [
        "embedded --quick",
        "embedded --quick --json e.json",
        "embedded --only melddb:8r2w:t4",
    ] {
        assert!(matches!(parse(line), Ok(Suite::Embedded(_))), "{line}");
    }
    for line in [
        "log --quick",
        "log --quick --json l.json",
        "log --json l.json --plots img",
    ] {
        match parse(line) {
            Ok(Suite::Log(a)) => assert!(a.point.is_none(), "{line}"),
            other => panic!("{line}: {other:?}"),
        }
    }
    assert!(matches!(
        parse("pipeline-plots --json p.json --plots img"),
        Ok(Suite::PipelinePlots(_))
    ));
    assert!(matches!(
        parse("embedded-plots --json e.json --plots img"),
        Ok(Suite::EmbeddedPlots(_))
    ));
}

#[test]
fn the_log_probe_takes_its_point_and_settings() {
    let Ok(Suite::Log(a)) = parse(
        "log --point 64x64x1024@150000 --secs 8 --warmup 4 --spares 6 --spares-wait --no-fsync",
    ) else {
        panic!("the probe did not parse");
    };
    assert_eq!(a.point, Some(PointSpec::Open(64, 64, 1024, 150_000.0)));
    let p = &a.probe;
    assert_eq!((p.secs, p.warmup, p.spares), (8.0, 4.0, 6));
    assert!(p.spares_wait && p.no_fsync && !p.direct && !p.fsync_each_file);
    for line in [
        "log --point 64x4x64x1024 --secs 4",
        "log --point 64x4x1x65536 --secs 8 --spares 6 --spares-wait --direct",
        "log --point 64x64x1024@150000 --secs 12 --spares 4 --spares-wait --fsync-each-file",
        "log --point 64x64x1024@150000 --secs 16 --disk-alone --data-shards 8",
        "log --point 64x4x1x65536 --json probe.json",
    ] {
        assert!(matches!(parse(line), Ok(Suite::Log(_))), "{line}");
    }
}

#[test]
fn flags_a_suite_does_not_take_are_refused() {
    for line in [
        // No suite.
        "",
        "--quick",
        // Other suites' flags.
        "log --quick --seed 1",
        "embedded --txns 100",
        "pipeline --only plain",
        "meld --keys 100",
        // The probe's flags without a point, or with what they exclude.
        "log --spares 4",
        "log --quick --disk-alone",
        "log --point 64x64x1024@150000 --disk-alone --direct",
        // Options the service no longer has, and probes of designs it
        // does not use.
        "log --point 64x64x1024@150000 --realtime 10",
        "log --point 64x64x1024@150000 --writer-cpu 1",
        "log --point 64x64x1024@150000 --slice-us 500",
        "log --point 64x64x1024@150000 --keep-thp",
        "log --point 64x64x1024@150000 --direct-every-block",
        "log --point 64x64x1024@150000 --disk-alone --direct-floors",
        "log --point 64x64x1024@150000 --disk-alone --overlap-depths 0,1,2,4",
        // A redraw needs both its input and its output.
        "pipeline-plots --json p.json",
        "embedded-plots --plots img",
        // A load point that is neither loop.
        "log --point 64x4x64",
    ] {
        assert!(parse(line).is_err(), "{line:?} parsed");
    }
}
