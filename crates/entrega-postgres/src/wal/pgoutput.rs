//! Decoding the messages of PostgreSQL's `pgoutput` plugin (protocol version 1) that a relay
//! of inserts needs: relation descriptions and inserted tuples. Transaction boundaries and
//! logical messages arrive already parsed by the replication client; every other message
//! (updates, deletes, truncates, types, origins) is recognised and skipped.
//!
//! The format is PostgreSQL's "Logical Replication Message Formats" chapter: big-endian
//! integers, NUL-terminated strings, and tuples whose columns are null, unchanged TOAST, text
//! or binary.

use std::collections::HashMap;

/// Why a message of the stream could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The message ended before a field it announced.
    #[error("pgoutput message `{tag}` is truncated at byte {at}")]
    Truncated {
        /// The message's tag byte, as a character.
        tag: char,
        /// Where the missing field starts.
        at: usize,
    },
    /// A string field was not UTF-8.
    #[error("pgoutput message `{tag}` has a name that is not UTF-8")]
    NotUtf8 {
        /// The message's tag byte.
        tag: char,
    },
    /// A tuple column of a kind protocol version 1 does not define.
    #[error("pgoutput tuple column kind `{kind}` is unknown")]
    ColumnKind {
        /// The kind byte.
        kind: char,
    },
    /// An insert of a relation whose description never came.
    #[error("pgoutput insert into relation {relation} without its description")]
    UnknownRelation {
        /// The relation's OID.
        relation: u32,
    },
    /// An empty message.
    #[error("empty pgoutput message")]
    Empty,
}

/// One column value of an inserted tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// The column's text output (the stream is read in text mode).
    Text(Vec<u8>),
    /// The column's binary send output (only when binary mode was asked for).
    Binary(Vec<u8>),
    /// An unchanged TOASTed value (updates only, never in an insert).
    Unchanged,
}

/// A relation as the stream describes it before its first change, and again after its shape
/// changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The relation's OID.
    pub id: u32,
    /// Its schema.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its column names, in tuple order.
    pub columns: Vec<String>,
    /// Each column's type OID, in the same order.
    pub types: Vec<u32>,
}

impl Relation {
    /// Where column `name` sits in this relation's tuples.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
}

/// What one decoded message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A relation description; kept by [`Decoder`] for the inserts that follow.
    Relation(Relation),
    /// A row inserted into relation `relation`.
    Insert {
        /// The relation's OID.
        relation: u32,
        /// The new tuple's values, in the relation's column order.
        values: Vec<Value>,
    },
    /// Anything a relay of inserts does not act on (begin, commit, update, delete,
    /// truncate, type, origin, logical message), with its tag.
    Other(char),
}

/// Decodes `pgoutput` messages, remembering relation descriptions.
#[derive(Debug, Default)]
pub struct Decoder {
    relations: HashMap<u32, Relation>,
}

impl Decoder {
    /// A decoder that knows no relation yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The description of relation `id`, once the stream sent it.
    pub fn relation(&self, id: u32) -> Option<&Relation> {
        self.relations.get(&id)
    }

    /// Decodes one message; a relation description is also remembered, and an insert must
    /// follow its relation's description.
    pub fn decode(&mut self, data: &[u8]) -> Result<Change, DecodeError> {
        let change = decode(data)?;
        match &change {
            Change::Relation(relation) => {
                self.relations.insert(relation.id, relation.clone());
            }
            Change::Insert { relation, .. } if !self.relations.contains_key(relation) => {
                return Err(DecodeError::UnknownRelation {
                    relation: *relation,
                });
            }
            _ => {}
        }
        Ok(change)
    }
}

/// Decodes one message on its own (no relation bookkeeping).
pub fn decode(data: &[u8]) -> Result<Change, DecodeError> {
    let (&tag, _) = data.split_first().ok_or(DecodeError::Empty)?;
    let mut r = Reader {
        data,
        at: 1,
        tag: char::from(tag),
    };
    match tag {
        b'R' => {
            let id = r.u32()?;
            let namespace = r.string()?;
            let name = r.string()?;
            let _replica_identity = r.u8()?;
            let count = r.u16()?;
            let mut columns = Vec::with_capacity(usize::from(count));
            let mut types = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let _flags = r.u8()?;
                columns.push(r.string()?);
                types.push(r.u32()?);
                let _modifier = r.u32()?;
            }
            Ok(Change::Relation(Relation {
                id,
                namespace,
                name,
                columns,
                types,
            }))
        }
        b'I' => {
            let relation = r.u32()?;
            let _new = r.u8()?;
            Ok(Change::Insert {
                relation,
                values: r.tuple()?,
            })
        }
        other => Ok(Change::Other(char::from(other))),
    }
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    tag: char,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(DecodeError::Truncated {
                tag: self.tag,
                at: self.at,
            });
        };
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let rest = self.data.get(self.at..).unwrap_or_default();
        let Some(len) = rest.iter().position(|&b| b == 0) else {
            return Err(DecodeError::Truncated {
                tag: self.tag,
                at: self.at,
            });
        };
        let bytes = self.take(len + 1)?;
        std::str::from_utf8(&bytes[..len])
            .map(str::to_owned)
            .map_err(|_| DecodeError::NotUtf8 { tag: self.tag })
    }

    fn tuple(&mut self) -> Result<Vec<Value>, DecodeError> {
        let count = self.u16()?;
        let mut values = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let kind = self.u8()?;
            values.push(match kind {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' | b'b' => {
                    let len = self.u32()? as usize;
                    let bytes = self.take(len)?.to_vec();
                    if kind == b't' {
                        Value::Text(bytes)
                    } else {
                        Value::Binary(bytes)
                    }
                }
                other => {
                    return Err(DecodeError::ColumnKind {
                        kind: char::from(other),
                    })
                }
            });
        }
        Ok(values)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn relation(id: u32, name: &str, columns: &[&str]) -> Vec<u8> {
        let typed: Vec<(&str, u32)> = columns.iter().map(|c| (*c, 25)).collect();
        relation_typed(id, name, &typed)
    }

    pub(crate) fn relation_typed(id: u32, name: &str, columns: &[(&str, u32)]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        m.extend(b"public\0");
        m.extend(name.as_bytes());
        m.push(0);
        m.push(b'd');
        m.extend((columns.len() as u16).to_be_bytes());
        for (c, oid) in columns {
            m.push(0);
            m.extend(c.as_bytes());
            m.push(0);
            m.extend(oid.to_be_bytes());
            m.extend(u32::MAX.to_be_bytes());
        }
        m
    }

    pub(crate) fn insert(id: u32, values: &[Option<&str>]) -> Vec<u8> {
        let values: Vec<Option<Vec<u8>>> = values
            .iter()
            .map(|v| v.map(|t| t.as_bytes().to_vec()))
            .collect();
        tuple(id, b't', &values)
    }

    pub(crate) fn insert_binary(id: u32, values: &[Option<Vec<u8>>]) -> Vec<u8> {
        tuple(id, b'b', values)
    }

    /// An insert whose values are all of `kind` (`t` text, `b` binary) or null.
    fn tuple(id: u32, kind: u8, values: &[Option<Vec<u8>>]) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(id.to_be_bytes());
        m.push(b'N');
        m.extend((values.len() as u16).to_be_bytes());
        for v in values {
            match v {
                None => m.push(b'n'),
                Some(bytes) => {
                    m.push(kind);
                    m.extend((bytes.len() as u32).to_be_bytes());
                    m.extend(bytes);
                }
            }
        }
        m
    }

    #[test]
    fn an_insert_decodes_after_its_relation() {
        let mut d = Decoder::new();
        let described = d.decode(&relation(7, "outbox", &["id", "carga"])).unwrap();
        assert!(matches!(described, Change::Relation(ref r) if r.columns == ["id", "carga"]));
        assert_eq!(d.relation(7).unwrap().position("carga"), Some(1));
        let change = d.decode(&insert(7, &[Some("a"), None])).unwrap();
        assert_eq!(
            change,
            Change::Insert {
                relation: 7,
                values: vec![Value::Text(b"a".to_vec()), Value::Null],
            }
        );
    }

    #[test]
    fn an_insert_before_its_relation_is_an_error() {
        let err = Decoder::new().decode(&insert(9, &[Some("a")])).unwrap_err();
        assert_eq!(err, DecodeError::UnknownRelation { relation: 9 });
    }

    #[test]
    fn every_truncation_is_an_error_never_a_panic() {
        let whole = [
            relation(7, "outbox", &["id", "carga"]),
            insert(7, &[Some("abc"), None]),
        ];
        for message in whole {
            for cut in 0..message.len() {
                let r = decode(&message[..cut]);
                assert!(r.is_err(), "cut at {cut} of {message:?} decoded: {r:?}");
            }
        }
    }

    #[test]
    fn unknown_kinds_and_other_messages_are_typed() {
        let mut bad = insert(7, &[Some("a")]);
        bad[8] = b'x';
        assert_eq!(decode(&bad), Err(DecodeError::ColumnKind { kind: 'x' }));
        assert_eq!(decode(b"U\0\0\0\x07"), Ok(Change::Other('U')));
        assert_eq!(decode(b""), Err(DecodeError::Empty));
    }
}
