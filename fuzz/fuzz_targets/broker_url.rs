//! `--broker` and `--database` URLs as an operator types them: every parser must answer with
//! a value or an error, never a panic, and the redacted form printed in logs and errors must
//! not show the value of a secret parameter.

#![no_main]

use entrega_amqp::AmqpConfig;
use entrega_core::{is_secret_name, redact_url};
use entrega_kafka::KafkaConfig;
use km0::wiring::config::{is_postgres, split_database, with_database, BrokerUrl, DataPlace};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Command-line arguments and environment variables reach the parsers as `&str`.
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    match BrokerUrl::parse(url) {
        Ok(broker) => {
            let _ = format!("{broker:?}");
        }
        Err(e) => {
            let _ = format!("{e} {e:?}");
        }
    }
    // Directly as well: `BrokerUrl` hands each parser only URLs of its own scheme (and adds
    // a parameter to AMQP ones), which leaves their scheme checks and raw input untried.
    let _ = format!("{:?}", KafkaConfig::from_url(url));
    let _ = format!("{:?}", AmqpConfig::from_url(url));
    let _ = format!("{:?}", DataPlace::parse(url));
    if is_postgres(url) {
        postgres_log_database(url);
    }
    secrets_are_redacted(url);
});

/// The log transport on PostgreSQL connects to the database the URL names, `km0_broker` when
/// it names none: replacing the name and reading it back must give the same server and name.
fn postgres_log_database(url: &str) {
    let (server, name) = split_database(url);
    let name = name.unwrap_or_else(|| "km0_broker".to_owned());
    let full = with_database(&server, &name);
    assert_eq!(split_database(&full), (server, Some(name)), "{full}");
}

/// No value of a secret query parameter (`password`, `sasl.password`, ...) in `redact_url`'s
/// output. Only values the check cannot mistake are tried: at least 4 characters, none of the
/// separators `redact_url` itself writes around a hidden value (`*`, `&`, `=`, `?`), and not
/// found anywhere else in the URL; such a value can only show through a redaction that
/// missed it.
fn secrets_are_redacted(url: &str) {
    let Some((before_query, query)) = url.split_once('?') else {
        return;
    };
    let params: Vec<(&str, Option<&str>)> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (param, None),
        })
        .collect();
    // The URL with every secret value taken out: all that may legitimately be shown.
    let mut rest = before_query.to_owned();
    for param in &params {
        rest.push('\n');
        rest.push_str(param.0);
        if let Some(value) = param.1.filter(|_| secret(param).is_none()) {
            rest.push('=');
            rest.push_str(value);
        }
    }
    let redacted = redact_url(url);
    for value in params.iter().filter_map(secret) {
        if value.chars().count() >= 4
            && !value.contains(['*', '&', '=', '?'])
            && !rest.contains(value)
        {
            assert!(
                !redacted.contains(value),
                "secret `{value}` shown in `{redacted}`"
            );
        }
    }
}

/// The value of a `name=value` query parameter whose name is a secret's.
fn secret<'a>(&(name, value): &(&str, Option<&'a str>)) -> Option<&'a str> {
    value.filter(|_| is_secret_name(name))
}
