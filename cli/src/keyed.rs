//! Command-line values that name a library enum by its stable key (`ModelKind::key`,
//! `Objective::key`, `ModelChoice::key`): one parser, so the CLI mirrors no library enum.

use clap::builder::{PossibleValuesParser, TypedValueParser};

/// A clap value parser for `T` named by one of `keys` (the possible values `--help` lists),
/// turned into `T` by the library's own `from_key`.
pub fn parser<T>(
    keys: &'static [&'static str],
    from_key: fn(&str) -> Option<T>,
) -> impl TypedValueParser<Value = T>
where
    T: Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(keys)
        .try_map(move |s: String| from_key(&s).ok_or_else(|| format!("unknown value {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use kace_selector::{ModelKind, Objective};

    #[derive(Debug, Parser)]
    struct Cli {
        #[arg(long, value_parser = parser(&["slowdown", "linear"], ModelKind::from_key))]
        kind: Option<ModelKind>,
        #[arg(long, default_value = "throughput-sum",
              value_parser = parser(&["throughput-sum", "normalised-progress"], Objective::from_key))]
        objective: Objective,
    }

    #[test]
    fn keys_parse_into_the_library_enum_and_others_are_refused() {
        let c = Cli::try_parse_from(["x", "--kind", "linear"]).unwrap();
        assert_eq!(c.kind, Some(ModelKind::Linear));
        assert_eq!(c.objective, Objective::ThroughputSum);
        let c = Cli::try_parse_from(["x", "--objective", "normalised-progress"]).unwrap();
        assert_eq!(c.objective, Objective::NormalisedProgress);
        // A key the library knows but this option does not offer is refused, naming the choices.
        let e = Cli::try_parse_from(["x", "--objective", "energy"]).unwrap_err().to_string();
        assert!(e.contains("possible values: throughput-sum, normalised-progress"), "{e}");
        assert!(Cli::try_parse_from(["x", "--kind", "Linear"]).is_err());
    }
}
