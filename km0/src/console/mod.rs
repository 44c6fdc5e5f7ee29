//! The web console: what an operator looks at and acts on, served by any km0 process with
//! `--console` on its operations endpoint (`/console/`), by `km0 up` by default.
//!
//! - pages (server-rendered HTML: [`overview`], [`dlq_pages`], [`saga_pages`], [`trace_view`]):
//!   every outbox and consumer group at a glance with a chart of the last minutes
//!   ([`history`]), dead letters (browse by page, filter, show; held ones too), order sagas
//!   (list, timeline) and the trace of one order across the services; the lists refresh
//!   themselves;
//! - actions (JSON, [`api`]): replay dead letters (with a dry run), discard them with a
//!   reason, one by one or every one a filter selects (confirmed by the count its dry run
//!   showed), retry a saga waiting for an operator. Each needs an operator token
//!   ([`auth`]) and is written to the audit (`entrega_dlq_audit`, the saga's history) under
//!   the token's operator;
//! - reads are open to loopback clients only; from elsewhere they need a token too.
//!
//! Everything, script and styles included, is served by the binary (ADR 0016).

mod api;
pub mod auth;
mod dlq_pages;
mod history;
mod html;
mod letters;
mod overview;
mod saga_pages;
mod trace_view;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use entrega::saga::Sagas;
use entrega::Db;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use auth::{BadToken, Operators};

use crate::services::inventario;
use crate::wiring::{databases, Broker, Database, System};

/// What the console's handlers share.
pub(crate) struct Console {
    broker: Broker,
    letters: letters::Letters,
    sagas: Sagas,
    operators: Operators,
    /// Every service's database with an outbox or entrega's tables, opened once.
    dbs: Vec<(&'static Database, Db)>,
    /// The overview chart's samples.
    history: history::History,
}

impl Console {
    /// The databases of the services that write events (an outbox each).
    fn outbox_dbs(&self) -> impl Iterator<Item = (&'static str, &Db)> {
        self.dbs
            .iter()
            .filter(|(d, _)| d.outbox)
            .map(|(d, db)| (d.name, db))
    }

    /// The databases whose consumers may hold dead letters the broker refused.
    fn held_dbs(&self) -> impl Iterator<Item = (&'static str, &Db)> {
        self.dbs
            .iter()
            .filter(|(d, _)| d.entrega_tables)
            .map(|(d, db)| (d.name, db))
    }
}

/// The console's routes under `/console`, over the deployment `system` (every service's
/// database and the broker), with `operators` allowed to act.
pub async fn router(system: System, operators: Operators) -> anyhow::Result<Router> {
    let broker = system.broker().await.context("opening the broker")?;
    let inventario = system
        .open(&inventario::DATABASE)
        .await
        .context("opening the inventario database")?;
    let letters = letters::Letters::new(&broker, inventario.dead_letters());
    let store = system
        .pedidos()
        .await
        .context("opening the pedidos database")?;
    let sagas = system
        .clone()
        .with_saga(system.saga().unwrap_or_default())
        .sagas(&store)
        .await
        .context("opening the order sagas")?;
    let mut dbs = Vec::new();
    for database in databases()
        .into_iter()
        .filter(|d| d.outbox || d.entrega_tables)
    {
        let db = system
            .database(database)
            .await
            .with_context(|| format!("opening the {} database", database.name))?;
        dbs.push((database, db));
    }
    let console = Arc::new(Console {
        broker,
        letters,
        sagas,
        operators,
        dbs,
        history: history::History::default(),
    });
    history::spawn_sampler(Arc::downgrade(&console));
    let (routes, _) = documented();
    let routes = routes
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&console),
            readers,
        ))
        .with_state(console);
    Ok(routes)
}

/// The console's routes, each through its documented handler, and their description.
pub(crate) fn documented() -> (axum::Router<Arc<Console>>, utoipa::openapi::OpenApi) {
    let (router, api) = OpenApiRouter::with_openapi(ConsoleDoc::openapi())
        .routes(routes!(overview::overview))
        .routes(routes!(dlq_pages::dead_letters))
        .routes(routes!(dlq_pages::dead_letter))
        .routes(routes!(saga_pages::sagas))
        .routes(routes!(saga_pages::saga))
        .routes(routes!(trace_view::page))
        .routes(routes!(api::whoami))
        .routes(routes!(api::replay))
        .routes(routes!(api::discard))
        .routes(routes!(api::retry_saga))
        .split_for_parts();
    // The same overview at `/console/`; the assets are the pages' own.
    let router = router
        .route("/console/", get(overview::overview))
        .route("/console/assets/console.css", get(css))
        .route("/console/assets/console.js", get(script));
    (router, api)
}

/// The operator's token: `Authorization: Bearer <secret>` (or the `km0_token` cookie).
struct OperatorToken;

impl utoipa::Modify for OperatorToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "operator",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An operator's secret (`--console-token name:secret`); pages read from \
                         loopback need none.",
                    ))
                    .build(),
            ),
        );
    }
}

#[derive(utoipa::OpenApi)]
#[openapi(
    modifiers(&OperatorToken),
    components(schemas(
        api::ReplayBody, api::DiscardBody, api::FilterBody, api::Operator, api::Retried, api::ActionReport,
        api::AppliedLetter, api::RefusedLetter, auth::RefusalBody
    ))
)]
struct ConsoleDoc;

/// Lets loopback clients read; others need a token for anything.
async fn readers(
    State(console): State<Arc<Console>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    if console.operators.may_read(peer, request.headers()) {
        next.run(request).await
    } else {
        auth::refused(
            StatusCode::UNAUTHORIZED,
            "the console answers other hosts only with an operator token",
        )
        .into_response()
    }
}

async fn css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/console.css"),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/console.js"),
    )
        .into_response()
}
