//! The committed contracts: one file per `tipo` and version (`<dir>/<tipo>/v<version>.json`),
//! holding every revision of its schema, oldest first, with the channel and its policy.
//!
//! [`Directory::check`] compares a [`Catalog`] (the code) with the files (what was agreed):
//! it is what CI runs, and it fails on a schema changed without its file, on a committed
//! history that breaks its policy, and on a change that breaks the policy. [`Directory::update`]
//! appends a revision only when it keeps the policy, so an incompatible change cannot be
//! committed without a new version.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::compat::{self, Compatibility, Violation};
use crate::{Catalog, Contract};

/// One committed contract file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContractFile {
    /// The event type.
    pub tipo: String,
    /// The version of `datos`.
    pub version: u32,
    /// The topic or queue it travels on.
    pub channel: String,
    /// The channel's policy when the last revision was written.
    pub compatibility: String,
    /// Every revision of the schema, oldest first.
    pub revisions: Vec<Value>,
}

/// Something `check` found that keeps the code and the committed contracts apart.
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    /// A contract the code has and no file records yet.
    New {
        /// The event type.
        tipo: String,
        /// The version.
        version: u32,
    },
    /// Only the last revision's descriptions (titles, comments) differ from the code's: the
    /// revision is rewritten in place.
    Reworded {
        /// The event type.
        tipo: String,
        /// The version.
        version: u32,
    },
    /// The code's schema differs from the last revision and keeps the policy: commit it.
    Changed {
        /// The event type.
        tipo: String,
        /// The version.
        version: u32,
    },
    /// The code's schema differs from the last revision and breaks the policy.
    Incompatible {
        /// The event type.
        tipo: String,
        /// The version.
        version: u32,
        /// The channel's policy.
        policy: Compatibility,
        /// How it breaks, per earlier revision.
        violations: Vec<Violation>,
    },
    /// A committed history whose revisions break their policy (edited by hand).
    BrokenHistory {
        /// The event type.
        tipo: String,
        /// The version.
        version: u32,
        /// The revision that breaks it, counted from 1.
        revision: usize,
        /// How.
        violations: Vec<Violation>,
    },
    /// A file whose contract the code no longer has.
    Gone {
        /// The event type.
        tipo: String,
        /// The version.
        version: u32,
    },
    /// A file that cannot be read, or a schema the check cannot read.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl Finding {
    /// Whether `update` can resolve it (a new contract, a compatible change).
    pub fn is_update(&self) -> bool {
        matches!(
            self,
            Self::New { .. } | Self::Reworded { .. } | Self::Changed { .. }
        )
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::New { tipo, version } => {
                write!(f, "`{tipo}` v{version} has no contract file yet")
            }
            Self::Reworded { tipo, version } => write!(
                f,
                "`{tipo}` v{version}: only its descriptions changed; its contract file is behind"
            ),
            Self::Changed { tipo, version } => write!(
                f,
                "`{tipo}` v{version} changed compatibly; its contract file is behind"
            ),
            Self::Incompatible {
                tipo,
                version,
                policy,
                violations,
            } => {
                write!(f, "`{tipo}` v{version} breaks {policy}:")?;
                for violation in violations {
                    write!(f, " {violation}")?;
                }
                write!(
                    f,
                    " Make the change compatible, or publish it as version {} with an upcaster \
                     from {version}.",
                    version + 1
                )
            }
            Self::BrokenHistory {
                tipo,
                version,
                revision,
                violations,
            } => {
                write!(
                    f,
                    "`{tipo}` v{version}: committed revision {revision} breaks its policy:"
                )?;
                for violation in violations {
                    write!(f, " {violation}")?;
                }
                Ok(())
            }
            Self::Gone { tipo, version } => write!(
                f,
                "`{tipo}` v{version} has a contract file but the code no longer declares it \
                 (delete the file to retire the version)"
            ),
            Self::Unreadable { path, reason } => write!(f, "{}: {reason}", path.display()),
        }
    }
}

/// The directory of committed contracts.
#[derive(Debug, Clone)]
pub struct Directory {
    root: PathBuf,
}

impl Directory {
    /// The contracts under `root` (it need not exist yet).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The file of `tipo` at `version`.
    pub fn path(&self, tipo: &str, version: u32) -> PathBuf {
        self.root.join(tipo).join(format!("v{version}.json"))
    }

    /// Every committed file.
    pub fn files(&self) -> io::Result<Vec<(PathBuf, Result<ContractFile, String>)>> {
        let mut out = Vec::new();
        if !self.root.exists() {
            return Ok(out);
        }
        let mut dirs: Vec<PathBuf> = fs::read_dir(&self.root)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        for dir in dirs {
            let mut files: Vec<PathBuf> = fs::read_dir(&dir)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            files.sort();
            for path in files {
                let parsed = read(&path);
                out.push((path, parsed));
            }
        }
        Ok(out)
    }

    /// What keeps `catalog` and the committed files apart; empty when they agree.
    pub fn check(&self, catalog: &Catalog) -> io::Result<Vec<Finding>> {
        let mut findings = Vec::new();
        for (path, file) in self.files()? {
            let file = match file {
                Ok(file) => file,
                Err(reason) => {
                    findings.push(Finding::Unreadable { path, reason });
                    continue;
                }
            };
            if let Err(finding) = history_holds(&path, &file) {
                findings.push(finding);
            }
            if catalog.get(&file.tipo, file.version).is_none() {
                findings.push(Finding::Gone {
                    tipo: file.tipo,
                    version: file.version,
                });
            }
        }
        for contract in catalog.contracts() {
            if let Some(finding) = self.compare(catalog, contract) {
                findings.push(finding);
            }
        }
        Ok(findings)
    }

    /// Writes what `check` found resolvable (new contracts, compatible changes) and returns
    /// those findings; writes nothing and returns every finding when any is not resolvable.
    pub fn update(&self, catalog: &Catalog) -> io::Result<Result<Vec<Finding>, Vec<Finding>>> {
        let findings = self.check(catalog)?;
        if findings.iter().any(|f| !f.is_update()) {
            return Ok(Err(findings));
        }
        for finding in &findings {
            let (Finding::New { tipo, version }
            | Finding::Reworded { tipo, version }
            | Finding::Changed { tipo, version }) = finding
            else {
                continue;
            };
            let Some(contract) = catalog.get(tipo, *version) else {
                continue;
            };
            let path = self.path(tipo, *version);
            let mut file = match read(&path) {
                Ok(file) => file,
                Err(_) => ContractFile {
                    tipo: tipo.clone(),
                    version: *version,
                    channel: contract.channel.clone(),
                    compatibility: String::new(),
                    revisions: Vec::new(),
                },
            };
            file.channel = contract.channel.clone();
            file.compatibility = catalog.policy_of(&contract.channel).as_str().to_owned();
            if matches!(finding, Finding::Reworded { .. }) {
                file.revisions.pop();
            }
            file.revisions.push(contract.schema.clone());
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            let mut text = serde_json::to_string_pretty(&file).map_err(io::Error::other)?;
            text.push('\n');
            fs::write(&path, text)?;
        }
        Ok(Ok(findings))
    }

    fn compare(&self, catalog: &Catalog, contract: &Contract) -> Option<Finding> {
        let path = self.path(&contract.tipo, contract.version);
        let tipo = contract.tipo.clone();
        let version = contract.version;
        let file = match read(&path) {
            Ok(file) => file,
            Err(_) if !path.exists() => return Some(Finding::New { tipo, version }),
            // Reported once, by the pass over the files.
            Err(_) => return None,
        };
        let last = file.revisions.last()?;
        if last == &contract.schema {
            return None;
        }
        if without_annotations(last) == without_annotations(&contract.schema) {
            return Some(Finding::Reworded { tipo, version });
        }
        let policy = catalog.policy_of(&contract.channel);
        match compat::check(policy, &file.revisions, &contract.schema) {
            Ok(violations) if violations.is_empty() => Some(Finding::Changed { tipo, version }),
            Ok(violations) => Some(Finding::Incompatible {
                tipo,
                version,
                policy,
                violations,
            }),
            Err(e) => Some(Finding::Unreadable {
                path,
                reason: format!("the code's schema: {e}"),
            }),
        }
    }
}

/// `schema` without what only describes it (`description`, `title`, `examples`,
/// `$comment`), for telling a reworded schema from a changed one. Member names under
/// `properties` and `$defs` are names, not keywords, and stay.
fn without_annotations(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "description" | "title" | "examples" | "$comment"
                    )
                })
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("properties" | "$defs", Value::Object(named)) => Value::Object(
                            named
                                .iter()
                                .map(|(name, s)| (name.clone(), without_annotations(s)))
                                .collect(),
                        ),
                        _ => without_annotations(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_annotations).collect()),
        other => other.clone(),
    }
}

fn read(path: &Path) -> Result<ContractFile, String> {
    let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
    let file: ContractFile = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if file.revisions.is_empty() {
        return Err("no revisions".to_owned());
    }
    Ok(file)
}

/// Each revision of `file` keeps the file's policy against the ones before it.
fn history_holds(path: &Path, file: &ContractFile) -> Result<(), Finding> {
    let policy: Compatibility = file
        .compatibility
        .parse()
        .map_err(|e| Finding::Unreadable {
            path: path.to_owned(),
            reason: format!("{e}"),
        })?;
    for n in 1..file.revisions.len() {
        let violations =
            compat::check(policy, &file.revisions[..n], &file.revisions[n]).map_err(|e| {
                Finding::Unreadable {
                    path: path.to_owned(),
                    reason: format!("revision {}: {e}", n + 1),
                }
            })?;
        if !violations.is_empty() {
            return Err(Finding::BrokenHistory {
                tipo: file.tipo.clone(),
                version: file.version,
                revision: n + 1,
                violations,
            });
        }
    }
    Ok(())
}
