//! The selector's error type.

use std::fmt;

/// Everything that can go wrong inside the selector. Input problems carry where they are.
#[derive(Debug, Clone, PartialEq)]
pub enum SelectorError {
    /// A model was asked to fit zero rows.
    EmptyTrainingSet,
    /// Rows or vectors of different lengths were combined.
    DimensionMismatch {
        /// The length that was expected.
        expected: usize,
        /// The length that was found.
        found: usize,
    },
    /// A NaN or infinite value in training data (`column` equal to the width means the target).
    NonFinite {
        /// Row index in the training set.
        row: usize,
        /// Column index.
        column: usize,
    },
    /// The linear algebra failed.
    Numerical(String),
    /// A data file could not be parsed.
    Data(DataError),
    /// The data are valid but cannot support the request (e.g. a workload with no profile).
    Invalid(String),
}

/// A parse error in a data file, naming the file, the line (1-based, header = 1) and the column.
#[derive(Debug, Clone, PartialEq)]
pub struct DataError {
    /// The file's name as the caller gave it.
    pub source: String,
    /// 1-based line number, when known.
    pub line: Option<u64>,
    /// Column name, when the problem is in one column.
    pub column: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl DataError {
    pub(crate) fn new(source: &str, line: Option<u64>, column: Option<&str>, msg: String) -> Self {
        DataError {
            source: source.to_string(),
            line,
            column: column.map(str::to_string),
            message: msg,
        }
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if let Some(l) = self.line {
            write!(f, ", line {l}")?;
        }
        if let Some(c) = &self.column {
            write!(f, ", column '{c}'")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelectorError::EmptyTrainingSet => write!(f, "no rows to train on"),
            SelectorError::DimensionMismatch { expected, found } => {
                write!(f, "expected {expected} values, found {found}")
            }
            SelectorError::NonFinite { row, column } => {
                write!(f, "non-finite value in training row {row}, column {column}")
            }
            SelectorError::Numerical(m) => write!(f, "{m}"),
            SelectorError::Data(e) => write!(f, "{e}"),
            SelectorError::Invalid(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for SelectorError {}

impl std::error::Error for DataError {}

impl From<DataError> for SelectorError {
    fn from(e: DataError) -> Self {
        SelectorError::Data(e)
    }
}
