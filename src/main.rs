//! The `counterd` binary: parse the command line, load settings, hand over to the library.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of the system allocator: the worker allocates and frees many small BSON
/// documents per event, which glibc's malloc served with much consolidation work and a peak
/// RSS that kept growing over a long backlog (see bench/RESULTS.md).
/// (`--features system-allocator` keeps the system's, for heap profilers.)
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's options (`mi_option_e` in its `mimalloc.h`, v2 and v3 alike).
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// mimalloc keeps memory it freed for a second before giving it back (`purge_delay`) and
/// commits its arenas eagerly: while a backlog is caught up, batches are freed faster than
/// that, and the process's RSS ran 40-60 MB above what the memory budget holds. counterd gives
/// memory back at once and commits on demand (`counterd run` catching up 1 000 events: peak
/// RSS 56 -> 26 MB; see bench/RESULTS.md). `MIMALLOC_PURGE_DELAY` and
/// `MIMALLOC_ARENA_EAGER_COMMIT` in the environment still win.
fn tune_allocator() {
    if cfg!(feature = "system-allocator") {
        return;
    }
    for (option, name) in [
        (MI_OPTION_PURGE_DELAY, "MIMALLOC_PURGE_DELAY"),
        (MI_OPTION_ARENA_EAGER_COMMIT, "MIMALLOC_ARENA_EAGER_COMMIT"),
    ] {
        if std::env::var_os(name).is_none() {
            // SAFETY: sets one of the allocator's options (an integer), before any thread but
            // this one runs.
            unsafe { libmimalloc_sys::mi_option_set(option, 0) };
        }
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = counterd::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("counterd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(counterd::cli::main(cli))
}
