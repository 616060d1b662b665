//! The `counterd` binary: parse the command line, load settings, hand over to the library.
//!
//! It keeps the system allocator (glibc's malloc on the shipped image). mimalloc served
//! counterd while a batch's events and statements were whole document trees; since events are
//! projected and statements are bytes, glibc's malloc gives a lower peak RSS *and* less CPU on
//! the same catch-up (phase M: 54-56 MB and 60-62 µs per event, against mimalloc's 66-68 MB and
//! 67-78 µs; bench/RESULTS.md), and heap profilers (heaptrack, massif) see every allocation.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = counterd::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("counterd: cannot start the async runtime: {e}");
            return ExitCode::from(counterd::cli::exit::INTERNAL);
        }
    };
    runtime.block_on(counterd::cli::main(cli))
}
