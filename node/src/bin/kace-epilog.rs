//! `kace-epilog`: the slurmd `Epilog=` entry point. A thin shell around
//! [`kace_node::epilog::run`]; like the prolog it always exits 0 (a failing epilog drains the
//! node) and logs why it did nothing, on stderr, which slurmd keeps in its log.

use std::process::ExitCode;

fn main() -> ExitCode {
    kace_node::hook::main(kace_node::hook::Phase::Epilog)
}
