//! Node-side code shared by kace-prolog and kace-epilog (filled by the co-scheduling issue).
