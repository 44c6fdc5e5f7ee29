//! Schema compatibility with the Confluent Schema Registry's rules, for JSON Schema.
//!
//! A schema's revisions are checked in order under a [`Compatibility`] policy: BACKWARD means
//! a reader of the new schema can read what the previous one allowed, FORWARD that a reader of
//! the previous one can read what the new one allows, FULL both; the `_TRANSITIVE` forms check
//! against every earlier revision instead of the last one. As in Confluent's JSON Schema rules,
//! the content model decides what "adding a property" means: in a closed model
//! (`additionalProperties: false`, what [`crate::schema_of`] writes) an optional property can
//! be added under BACKWARD, because no earlier event can carry it.

pub(crate) mod node;
mod subset;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

/// A compatibility policy (Confluent's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compatibility {
    /// No check.
    None,
    /// The new schema reads data written under the previous one.
    Backward,
    /// The new schema reads data written under every earlier one. The default.
    #[default]
    BackwardTransitive,
    /// The previous schema reads data written under the new one.
    Forward,
    /// Every earlier schema reads data written under the new one.
    ForwardTransitive,
    /// Backward and forward against the previous schema.
    Full,
    /// Backward and forward against every earlier schema.
    FullTransitive,
}

impl Compatibility {
    /// Every policy.
    pub const ALL: [Compatibility; 7] = [
        Self::None,
        Self::Backward,
        Self::BackwardTransitive,
        Self::Forward,
        Self::ForwardTransitive,
        Self::Full,
        Self::FullTransitive,
    ];

    /// The registry's name (`BACKWARD_TRANSITIVE`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "NONE",
            Self::Backward => "BACKWARD",
            Self::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Self::Forward => "FORWARD",
            Self::ForwardTransitive => "FORWARD_TRANSITIVE",
            Self::Full => "FULL",
            Self::FullTransitive => "FULL_TRANSITIVE",
        }
    }

    fn backward(self) -> bool {
        matches!(
            self,
            Self::Backward | Self::BackwardTransitive | Self::Full | Self::FullTransitive
        )
    }

    fn forward(self) -> bool {
        matches!(
            self,
            Self::Forward | Self::ForwardTransitive | Self::Full | Self::FullTransitive
        )
    }

    fn transitive(self) -> bool {
        matches!(
            self,
            Self::BackwardTransitive | Self::ForwardTransitive | Self::FullTransitive
        )
    }
}

impl fmt::Display for Compatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not one of Confluent's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown compatibility policy `{0}` (one of NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL, FULL_TRANSITIVE)")]
pub struct UnknownPolicy(pub String);

impl FromStr for Compatibility {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// One place where a reader would refuse what a writer may send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where, as a path of member names (`lineas[].precio_centimos`); empty for the root.
    pub path: String,
    /// What breaks there.
    pub rule: String,
}

impl Problem {
    fn new(path: &str, rule: impl Into<String>) -> Self {
        Self {
            path: path.to_owned(),
            rule: rule.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "(the event)"
        } else {
            &self.path
        };
        write!(f, "`{path}`: {}", self.rule)
    }
}

/// A schema the check cannot read: a keyword it does not support, a broken `$ref`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schema at `{path}`: {reason}")]
pub struct SchemaError {
    /// Where in the schema's data.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

impl SchemaError {
    fn new(path: &str, reason: impl Into<String>) -> Self {
        Self {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }
}

/// Which way a reader and a writer were compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The new schema reading an earlier revision's data.
    Backward,
    /// An earlier revision reading the new schema's data.
    Forward,
}

/// The new schema breaks the policy against one earlier revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The earlier revision, counted from 1.
    pub revision: usize,
    /// Which way it breaks.
    pub direction: Direction,
    /// Where and how.
    pub problems: Vec<Problem>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.direction {
            Direction::Backward => write!(
                f,
                "the new schema cannot read events written under revision {}: ",
                self.revision
            )?,
            Direction::Forward => write!(
                f,
                "readers of revision {} cannot read the new schema's events: ",
                self.revision
            )?,
        }
        let problems: Vec<String> = self.problems.iter().map(ToString::to_string).collect();
        write!(f, "{}.", problems.join("; "))
    }
}

/// The problems that keep a reader of `reader` from reading everything `writer` allows.
pub fn reader_accepts(reader: &Value, writer: &Value) -> Result<Vec<Problem>, SchemaError> {
    subset::Pair { reader, writer }.accepts(reader, writer, "", 0)
}

/// Checks `candidate` as the next revision after `history` (oldest first) under `policy`;
/// the violations found, one per earlier revision and direction that breaks.
pub fn check(
    policy: Compatibility,
    history: &[Value],
    candidate: &Value,
) -> Result<Vec<Violation>, SchemaError> {
    let against: Vec<(usize, &Value)> = if policy.transitive() {
        history
            .iter()
            .enumerate()
            .map(|(i, s)| (i + 1, s))
            .collect()
    } else {
        history
            .iter()
            .enumerate()
            .map(|(i, s)| (i + 1, s))
            .next_back()
            .into_iter()
            .collect()
    };
    let mut violations = Vec::new();
    for (revision, earlier) in against {
        let checks = [
            (policy.backward(), Direction::Backward, candidate, earlier),
            (policy.forward(), Direction::Forward, earlier, candidate),
        ];
        for (wanted, direction, reader, writer) in checks {
            if !wanted {
                continue;
            }
            let problems = reader_accepts(reader, writer)?;
            if !problems.is_empty() {
                violations.push(Violation {
                    revision,
                    direction,
                    problems,
                });
            }
        }
    }
    Ok(violations)
}
