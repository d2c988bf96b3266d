//! `melddb-log`: run the log service, check its segments, print an example
//! configuration.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use melddb_log::{Config, ConfigError, Store};

#[derive(Parser)]
#[command(
    name = "melddb-log",
    version,
    about = "MeldDB log service: the shared, striped, parity-protected log"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the service until SIGINT or SIGTERM.
    Serve {
        /// TOML configuration (see `melddb-log example-config`).
        #[arg(long)]
        config: PathBuf,
    },
    /// Open the segments (recovering), read every page, rebuild damaged
    /// segments from parity, and print a JSON report. Exit code 1 if a
    /// stripe cannot be rebuilt, 2 on a bad configuration, 3 while
    /// another process (a running service) holds the zones.
    Check {
        /// TOML configuration.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print a documented example configuration.
    ExampleConfig,
}

const EXAMPLE: &str = include_str!("../example.toml");

fn load(path: &PathBuf) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    Config::from_toml(&text)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::ExampleConfig => {
            print!("{EXAMPLE}");
            ExitCode::SUCCESS
        }
        Cmd::Check { config } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let store = match Store::open(config) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return open_failed(&e);
                }
            };
            // Progress on stderr (the report is JSON on stdout): a line
            // every two seconds on a long scrub.
            let started = std::time::Instant::now();
            let mut shown = started;
            let scrub = store.scrub_with_progress(&mut |p| {
                if shown.elapsed().as_secs_f64() >= 2.0 {
                    shown = std::time::Instant::now();
                    let mib = |b: u64| b as f64 / (1 << 20) as f64;
                    eprintln!(
                        "scrub: {}/{} stripes, {:.0}/{:.0} MiB, {:.0} MiB/s",
                        p.stripes_done,
                        p.stripes,
                        mib(p.bytes_done),
                        mib(p.bytes),
                        mib(p.bytes_done) / started.elapsed().as_secs_f64()
                    );
                }
            });
            let bad = !scrub.unrecoverable.is_empty();
            let out = serde_json::json!({
                "recovery": store.recovery(),
                "scrub": scrub,
                "stats": store.stats(),
            });
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            store.shutdown();
            if bad {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Cmd::Serve { config } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            rt.block_on(async move {
                let store = match tokio::task::spawn_blocking(move || Store::open(config)).await {
                    Ok(Ok(s)) => Arc::new(s),
                    Ok(Err(e)) => {
                        eprintln!("error: {e}");
                        return open_failed(&e);
                    }
                    Err(e) => {
                        eprintln!("error: recovery panicked: {e}");
                        return ExitCode::from(1);
                    }
                };
                let running = match melddb_log::start(store.clone()).await {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("error: cannot listen: {e}");
                        return ExitCode::from(1);
                    }
                };
                // Tools and tests read the bound addresses from stdout.
                println!(
                    "{}",
                    serde_json::json!({ "tcp": running.tcp.to_string(), "http": running.http.to_string() })
                );
                wait_for_signal().await;
                tracing::info!("shutting down");
                running.shutdown().await;
                let _ = tokio::task::spawn_blocking(move || store.shutdown()).await;
                ExitCode::SUCCESS
            })
        }
    }
}

/// The exit code of a failed open: 3 when another process holds the
/// zones or a device (a script may wait and retry), 2 for a
/// configuration the open refused (as for one that does not parse: fix
/// the file), 1 for anything else.
fn open_failed(e: &melddb_log::OpenError) -> ExitCode {
    match e {
        melddb_log::OpenError::InUse { .. } | melddb_log::OpenError::DeviceInUse { .. } => {
            ExitCode::from(3)
        }
        melddb_log::OpenError::Config(_) => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
