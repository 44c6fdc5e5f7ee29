//! pagos on messaging: the charge of each `pedido.creado` (consumed with commits after
//! processing), and the card authorisations answered on `pagos.autorizaciones`.

use std::sync::Arc;

use async_trait::async_trait;
use entrega::db::Tx;
use entrega::rpc::{AnswerInTx, Writes};
use entrega::{Handler, Message, Router};
use entrega_core::{now_ms, HandlerError, RpcMessage};

use super::db::{
    authorisation_rows, record_authorisation, record_authorisations, ChargeStart, PaymentStore,
};
use super::domain::{Authorisation, AuthorisationRequest, OrderForPayment, OrderToCharge};
use super::gateway::Gateway;
use crate::contracts;
use crate::services::pedidos::{ORDER_CANCELLED, ORDER_CREATED, ORDER_PAID};

/// pagos' consumer group on the order events.
pub const GROUP: &str = "pagos";
/// The topic it reads.
pub const TOPIC: &str = crate::services::pedidos::TOPIC;
/// The request queue of card authorisations (DESIGN §2).
pub const AUTHORISATIONS: &str = "pagos.autorizaciones";
/// Who stores the authorisations' answers in `entrega_answers`.
pub const AUTHORISER: &str = "pagos.autorizacion";
/// Where pagos' events go.
pub const EVENTS_TOPIC: &str = "pagos.eventos";

/// Charges each created order once at the gateway.
#[derive(Debug)]
pub struct ChargeConsumer {
    store: PaymentStore,
    gateway: Gateway,
}

impl ChargeConsumer {
    /// Charges through `gateway`, recording in `store`.
    pub fn new(store: PaymentStore, gateway: Gateway) -> Self {
        Self { store, gateway }
    }

    /// `pedido.creado` to this consumer; the other order events pass.
    pub fn router(self: &Arc<Self>) -> Router {
        let handler: Arc<dyn Handler> = self.clone();
        Router::new()
            .route(ORDER_CREATED, handler)
            .ignore(ORDER_PAID)
            .ignore(ORDER_CANCELLED)
    }
}

#[async_trait]
impl Handler for ChargeConsumer {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        if contracts::is_other_copy::<OrderForPayment>(&msg.headers, msg.envelope.version) {
            // The same order published at another version, which pagos reads instead.
            return Ok(());
        }
        let placed =
            OrderForPayment::from_envelope(&msg.envelope).map_err(HandlerError::contract)?;
        if placed.charge.is_some() {
            // The order saga charges this order by command (`pagos.cobrar`): only the key.
            return Ok(self.store.mark_processed(&msg.id()).await?);
        }
        let order = OrderToCharge::from_order(&placed).map_err(HandlerError::permanent)?;
        if self.store.begin_charge(&order, now_ms()).await? == ChargeStart::Settled {
            // Charged (or declined) before, under another delivery: only the key is new.
            self.store.mark_processed(&msg.id()).await?;
            return Ok(());
        }
        // No transaction is open here: the gateway may take seconds.
        let outcome = self.gateway.charge(&order).await.map_err(|e| {
            if e.is_transient() {
                HandlerError::transient(e)
            } else {
                HandlerError::permanent(e)
            }
        })?;
        self.store
            .finish_charge(&msg.id(), &order, &outcome, now_ms())
            .await?;
        Ok(())
    }
}

/// Answers card authorisations (`{"pedido_id", "importe_centimos"}`), once per order: a
/// repeat gets the stored answer ([`entrega::rpc::StoredAnswers`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Authoriser;

#[async_trait]
impl AnswerInTx for Authoriser {
    fn key(&self, request: &RpcMessage) -> Result<String, HandlerError> {
        AuthorisationRequest::from_json(&request.payload)
            .map(|r| r.key())
            .map_err(HandlerError::permanent)
    }

    async fn answer_in(&self, tx: &mut Tx, request: &RpcMessage) -> Result<Vec<u8>, HandlerError> {
        let request =
            AuthorisationRequest::from_json(&request.payload).map_err(HandlerError::permanent)?;
        let decision = Authorisation::decide(&request);
        record_authorisation(tx, &request, &decision, now_ms()).await?;
        Ok(decision
            .to_json(&request.order_id)?
            .to_string()
            .into_bytes())
    }

    /// The batch's authorisations in one statement.
    async fn answer_all_in(
        &self,
        tx: &mut Tx,
        requests: &[&RpcMessage],
    ) -> Result<Vec<Vec<u8>>, HandlerError> {
        let decided = decide_all(requests)?;
        let rows: Vec<_> = decided.iter().map(|(r, d)| (r, d)).collect();
        record_authorisations(tx, &rows, now_ms()).await?;
        answers_of(&decided)
    }

    /// The batch's authorisations as statements: written with their stored answers in one
    /// round trip to the database.
    fn writes_for(&self, requests: &[&RpcMessage]) -> Option<Result<Writes, HandlerError>> {
        Some(decide_all(requests).and_then(|decided| {
            let rows: Vec<_> = decided.iter().map(|(r, d)| (r, d)).collect();
            Ok(Writes {
                statements: authorisation_rows(&rows, now_ms()),
                answers: answers_of(&decided)?,
            })
        }))
    }
}

/// Each request read and decided; the first unreadable one fails the lot.
fn decide_all(
    requests: &[&RpcMessage],
) -> Result<Vec<(AuthorisationRequest, Authorisation)>, HandlerError> {
    requests
        .iter()
        .map(|r| {
            let request =
                AuthorisationRequest::from_json(&r.payload).map_err(HandlerError::permanent)?;
            let decision = Authorisation::decide(&request);
            Ok((request, decision))
        })
        .collect()
}

/// The replies' bodies, in order.
fn answers_of(
    decided: &[(AuthorisationRequest, Authorisation)],
) -> Result<Vec<Vec<u8>>, HandlerError> {
    decided
        .iter()
        .map(|(r, d)| Ok(d.to_json(&r.order_id)?.to_string().into_bytes()))
        .collect()
}

/// The authorisation server's settings on `db`: batches of up to 64 authorisations, each
/// in one transaction; one lane on SQLite (its writers queue for one lock anyway), two on
/// PostgreSQL, whose connections commit side by side (more lanes make smaller batches and
/// more commits for the same calls).
pub fn server_config(db: &entrega::db::Db) -> entrega::rpc::RpcServerConfig {
    let mut config = entrega::rpc::RpcServerConfig::new(AUTHORISATIONS);
    config.max_batch = 64;
    config.lanes = match db.backend() {
        entrega::db::Backend::Sqlite => 1,
        entrega::db::Backend::Postgres => 2,
    };
    config
}
