//! Secrets kept out of output: URLs and client settings are shown with their passwords and
//! keys replaced by `***`, in logs, errors and anything printed for people.

/// What a secret is replaced with.
pub const REDACTED: &str = "***";

/// Whether a setting or URL parameter of this name holds a secret (`password`,
/// `sasl.password`, `ssl.key.password`, `sslpassword`, `ssl.key.pem`, tokens, secrets, API
/// keys), compared without regard to case.
pub fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "api_key",
        "key.pem",
        "oauthbearer",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// `url` with the password of its user information and the values of its secret
/// parameters ([`is_secret_name`]) replaced by [`REDACTED`]. Anything that does not read as
/// a URL is returned with the same rules applied to what can be found.
///
/// ```
/// use entrega_core::redact_url;
/// assert_eq!(
///     redact_url("postgres://km0:km0_dev@db:5432/km0?sslmode=require&sslpassword=x"),
///     "postgres://km0:***@db:5432/km0?sslmode=require&sslpassword=***"
/// );
/// assert_eq!(
///     redact_url("kafka://k:9093?sasl.username=u&sasl.password=p"),
///     "kafka://k:9093?sasl.username=u&sasl.password=***"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let (before_query, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = redact_user_info(before_query);
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _)) if is_secret_name(name) => format!("{name}={REDACTED}"),
                _ => param.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out
}

/// `scheme://user:password@rest` with the password replaced; anything else unchanged.
fn redact_user_info(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The user information ends at the last `@` before the path.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let (user_info, host) = rest.split_at(at);
    match user_info.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:{REDACTED}{host}"),
        None => url.to_owned(),
    }
}

/// `(name, value)` settings with the values of secret ones replaced, for `Debug` output.
pub fn redact_settings(settings: &[(String, String)]) -> Vec<(String, String)> {
    settings
        .iter()
        .map(|(name, value)| {
            let shown = if is_secret_name(name) {
                REDACTED.to_owned()
            } else {
                value.clone()
            };
            (name.clone(), shown)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_user_information_are_hidden() {
        assert_eq!(
            redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("postgres://u:p@ss:w@rd@h/db"),
            "postgres://u:***@h/db",
            "a password holding `@` and `:`"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432"),
            "postgres://postgres@127.0.0.1:5432"
        );
        assert_eq!(
            redact_url("sqlite://km0-data/broker.db"),
            "sqlite://km0-data/broker.db"
        );
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url(""), "");
    }

    #[test]
    fn secret_parameters_are_hidden_and_others_kept() {
        assert_eq!(
            redact_url("kafka://a:1,b:2?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-256&sasl.username=km0&sasl.password=hunter2&ssl.key.password=k&session_timeout_ms=6000"),
            "kafka://a:1,b:2?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-256&sasl.username=km0&sasl.password=***&ssl.key.password=***&session_timeout_ms=6000"
        );
        assert_eq!(redact_url("kafka://a:1?&flag&x=1"), "kafka://a:1?&flag&x=1");
        assert_eq!(
            redact_url("https://maps?token=abc&Api_Key=z"),
            "https://maps?token=***&Api_Key=***"
        );
    }

    #[test]
    fn settings_lists_keep_names_and_hide_secret_values() {
        let shown = redact_settings(&[
            ("sasl.username".into(), "km0".into()),
            ("SASL.PASSWORD".into(), "hunter2".into()),
        ]);
        assert_eq!(shown[0].1, "km0");
        assert_eq!(shown[1].1, REDACTED);
    }
}
