//! `kace-prolog`: the slurmd prolog entry point. It must always exit 0 so that kace never drains a node.

fn main() {
    // Not wired yet: the co-scheduling issue fills this in. Exiting 0 keeps the node up.
    eprintln!("kace: prolog: nothing to do: kace-prolog is not implemented in this build");
}
