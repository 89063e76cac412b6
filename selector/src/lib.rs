//! kace's pure decision core: workload profiles, pair features, models, policies and selection.
