//! Reading a statement's text the way the database will: placeholders (`$1`, `$2`, ...)
//! told apart from the same characters inside string literals, quoted names and comments,
//! so several statements can be joined into one text with their parameters numbered on.

/// A statement's text with its placeholders renumbered, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shifted {
    /// The text, each `$n` now `$(n + offset)`, without a trailing `;`.
    pub text: String,
    /// Its first word, upper-cased (`INSERT`, `UPDATE`, ...).
    pub verb: String,
    /// Whether it has a `RETURNING` clause.
    pub returning: bool,
}

/// Why a statement cannot be joined to others.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum NotJoinable {
    /// More than one statement in one text.
    #[error("the text holds more than one statement")]
    Several,
    /// A placeholder beyond the statement's own parameters.
    #[error("placeholder ${number} but only {bound} parameters are bound")]
    Unbound {
        /// The placeholder's number.
        number: usize,
        /// The parameters bound.
        bound: usize,
    },
    /// A placeholder that is not `$` and digits (`?`, `:name`, `@name`).
    #[error("placeholder `{0}`: only numbered `$n` placeholders can be renumbered")]
    Unnumbered(char),
    /// A string, quoted name or comment left open.
    #[error("the text ends inside a string, quoted name or comment")]
    Unterminated,
}

/// Renumbers the placeholders of `sql` (which binds `bound` parameters) by `offset`.
pub(super) fn shift(sql: &str, offset: usize, bound: usize) -> Result<Shifted, NotJoinable> {
    let chars: Vec<char> = sql
        .trim()
        .trim_end_matches(';')
        .trim_end()
        .chars()
        .collect();
    let mut out = String::with_capacity(sql.len() + 16);
    let mut verb = String::new();
    let mut returning = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' | '"' => {
                let end = closing(&chars, i + 1, c).ok_or(NotJoinable::Unterminated)?;
                out.extend(&chars[i..end]);
                i = end;
            }
            '-' if chars.get(i + 1) == Some(&'-') => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '\n')
                    .map_or(chars.len(), |p| i + p + 1);
                out.extend(&chars[i..end]);
                i = end;
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                let end = block_end(&chars, i + 2).ok_or(NotJoinable::Unterminated)?;
                out.extend(&chars[i..end]);
                i = end;
            }
            '$' => {
                let digits = chars[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit())
                    .count();
                if digits > 0 {
                    let text: String = chars[i + 1..i + 1 + digits].iter().collect();
                    let number: usize = text.parse().map_err(|_| NotJoinable::Unbound {
                        number: usize::MAX,
                        bound,
                    })?;
                    if number == 0 || number > bound {
                        return Err(NotJoinable::Unbound { number, bound });
                    }
                    out.push('$');
                    out.push_str(&(number + offset).to_string());
                    i += 1 + digits;
                } else {
                    // A dollar-quoted string: `$tag$ ... $tag$`.
                    let tag_len = chars[i + 1..]
                        .iter()
                        .take_while(|c| c.is_alphanumeric() || **c == '_')
                        .count();
                    if chars.get(i + 1 + tag_len) != Some(&'$') {
                        return Err(NotJoinable::Unnumbered('$'));
                    }
                    let tag: Vec<char> = chars[i..i + tag_len + 2].to_vec();
                    let body = i + tag.len();
                    let end = find(&chars, body, &tag).ok_or(NotJoinable::Unterminated)?;
                    out.extend(&chars[i..end + tag.len()]);
                    i = end + tag.len();
                }
            }
            '?' | ':' | '@' if placeholder_start(&chars, i) => {
                return Err(NotJoinable::Unnumbered(c));
            }
            ';' => return Err(NotJoinable::Several),
            c if c.is_alphabetic() || c == '_' => {
                let len = chars[i..]
                    .iter()
                    .take_while(|c| c.is_alphanumeric() || **c == '_')
                    .count();
                let word: String = chars[i..i + len].iter().collect();
                if verb.is_empty() {
                    verb = word.to_uppercase();
                } else if word.eq_ignore_ascii_case("returning") {
                    returning = true;
                }
                out.push_str(&word);
                i += len;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(Shifted {
        text: out,
        verb,
        returning,
    })
}

/// The index just past the quote closing a string or name opened before `from` (a doubled
/// quote is an escaped one).
fn closing(chars: &[char], from: usize, quote: char) -> Option<usize> {
    let mut i = from;
    while i < chars.len() {
        if chars[i] == quote {
            if chars.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

/// The index just past the `*/` closing a block comment opened before `from`.
fn block_end(chars: &[char], from: usize) -> Option<usize> {
    (from..chars.len().saturating_sub(1))
        .find(|&i| chars[i] == '*' && chars[i + 1] == '/')
        .map(|i| i + 2)
}

/// Where `needle` starts at or after `from`.
fn find(chars: &[char], from: usize, needle: &[char]) -> Option<usize> {
    (from..=chars.len().saturating_sub(needle.len())).find(|&i| chars[i..].starts_with(needle))
}

/// Whether the `?`, `:` or `@` at `i` starts a placeholder (`?`, `?1`, `:name`, `@name`),
/// not an operator (PostgreSQL's `::` casts, `@>`, `?|`).
fn placeholder_start(chars: &[char], i: usize) -> bool {
    let next = chars.get(i + 1).copied();
    let prev = i.checked_sub(1).map(|p| chars[p]);
    match chars[i] {
        '?' => !matches!(next, Some('|' | '&')),
        ':' => {
            prev != Some(':')
                && next != Some(':')
                && next.is_some_and(|c| c.is_alphabetic() || c == '_')
        }
        '@' => next.is_some_and(|c| c.is_alphabetic() || c == '_'),
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_on_and_the_rest_is_kept() {
        let s = shift(
            "INSERT INTO t (a, b) VALUES ($1, to_timestamp($2::BIGINT / 1000.0));",
            3,
            2,
        )
        .unwrap();
        assert_eq!(
            s.text,
            "INSERT INTO t (a, b) VALUES ($4, to_timestamp($5::BIGINT / 1000.0))"
        );
        assert_eq!(s.verb, "INSERT");
        assert!(!s.returning);
    }

    #[test]
    fn literals_names_and_comments_are_not_placeholders() {
        let sql =
            "update \"t$1\" set a = 'it''s $2; ok' -- $3;\n, b = $1 /* $4; */, c = $q$ $5; $q$";
        let s = shift(sql, 10, 1).unwrap();
        assert_eq!(
            s.text,
            "update \"t$1\" set a = 'it''s $2; ok' -- $3;\n, b = $11 /* $4; */, c = $q$ $5; $q$"
        );
        assert_eq!(s.verb, "UPDATE");
    }

    #[test]
    fn what_cannot_be_joined_is_named() {
        assert_eq!(
            shift("DELETE FROM t; DELETE FROM u", 0, 0),
            Err(NotJoinable::Several)
        );
        assert_eq!(
            shift("DELETE FROM t WHERE a = $2", 0, 1),
            Err(NotJoinable::Unbound {
                number: 2,
                bound: 1
            })
        );
        assert_eq!(
            shift("DELETE FROM t WHERE a = ?", 0, 1),
            Err(NotJoinable::Unnumbered('?'))
        );
        assert_eq!(
            shift("DELETE FROM t WHERE a = :a", 0, 1),
            Err(NotJoinable::Unnumbered(':'))
        );
        assert_eq!(
            shift("DELETE FROM t WHERE a = 'open", 0, 0),
            Err(NotJoinable::Unterminated)
        );
        assert!(
            shift("DELETE FROM t WHERE a = $1 RETURNING a", 0, 1)
                .unwrap()
                .returning
        );
        assert_eq!(
            shift("SELECT '{}'::jsonb @> $1", 0, 1).unwrap().verb,
            "SELECT"
        );
    }
}
