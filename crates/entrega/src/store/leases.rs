//! Fenced slot leases shared by live members, written once for the relay's lanes
//! (`entrega_relay_lanes` among `entrega_relay_instances`) and a consumer group's partitions
//! (`entrega_partition_leases` among `entrega_group_members`, per group and topic).
//!
//! One balance is one write transaction: read every slot (locked: SQLite's write
//! transaction locks the database from its start, PostgreSQL locks the slot rows in slot
//! order), heartbeat the member, forget members silent for a whole lease, plan with
//! [`plan_balance`], write the plan. Two members never plan from the same picture, so they
//! never take the same slot, and taking a slot bumps its token, which fences out any late
//! write of its previous holder. A slot records the incarnation of the member that took it,
//! so a member's later life takes its earlier life's slots at once (see
//! [`entrega_core::Holder`]).

use entrega_core::{plan_balance, Holder, SlotLease, StoreError};

use crate::db::{query, IntList, Query, Tx};

/// Where one kind of lease lives.
pub(crate) struct LeaseTable<'a> {
    /// The slots' table.
    pub(crate) leases: &'static str,
    /// Its slot column.
    pub(crate) slot: &'static str,
    /// The members' table, with `seen_at_ms`.
    pub(crate) members: &'static str,
    /// The members' table's column naming the member.
    pub(crate) member: &'static str,
    /// Columns both tables are filtered on, with their values (`$1`, `$2`, ...).
    pub(crate) scope: &'a [(&'static str, &'a str)],
}

/// A slot held after balancing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldSlot {
    /// The slot.
    pub(crate) slot: u32,
    /// Fencing token of this holding.
    pub(crate) token: i64,
    /// When the lease ends unless renewed, epoch ms.
    pub(crate) expires_at_ms: i64,
}

impl LeaseTable<'_> {
    /// `WHERE` conditions on the scope, `$1` onwards (`TRUE` without a scope).
    fn scoped(&self) -> String {
        if self.scope.is_empty() {
            return "TRUE".to_owned();
        }
        self.scope
            .iter()
            .enumerate()
            .map(|(i, (column, _))| format!("{column} = ${}", i + 1))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// `text` with the scope's values bound first.
    fn query(&self, text: String) -> Query {
        self.scope
            .iter()
            .fold(query(text), |q, (_, value)| q.bind(*value))
    }

    /// The placeholder after the scope's and `n` more.
    fn param(&self, n: usize) -> String {
        format!("${}", self.scope.len() + n)
    }

    /// Records that `owner` is alive, joining the members if new.
    pub(crate) fn heartbeat(&self, owner: &str, now_ms: i64) -> Query {
        let mut columns: Vec<&str> = self.scope.iter().map(|(c, _)| *c).collect();
        columns.push(self.member);
        let values: Vec<String> = (1..=columns.len() + 1).map(|n| format!("${n}")).collect();
        let columns = columns.join(", ");
        self.query(format!(
            "INSERT INTO {} ({columns}, seen_at_ms) VALUES ({}) \
             ON CONFLICT ({columns}) DO UPDATE SET seen_at_ms = excluded.seen_at_ms",
            self.members,
            values.join(", "),
        ))
        .bind(owner)
        .bind(now_ms)
    }

    fn corrupt(&self, slot: i64) -> StoreError {
        StoreError::Corrupt {
            table: self.leases,
            reason: format!("{} {slot} out of range", self.slot),
        }
    }

    fn slot_of(&self, slot: i64) -> Result<u32, StoreError> {
        u32::try_from(slot).map_err(|_| self.corrupt(slot))
    }
}

/// Heartbeats `holder` in `table`'s members, renews its leases for `ttl_ms`, takes its
/// earlier life's slots and free or expired ones up to its fair share and gives back its
/// surplus, in `tx`. Returns what it holds, by slot: nothing once a later life of its name
/// holds slots (logged once per balance).
pub(crate) async fn balance(
    tx: &mut Tx,
    table: &LeaseTable<'_>,
    holder: &Holder,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<Vec<HeldSlot>, StoreError> {
    let owner = holder.name.as_str();
    let (leases, slot, scoped) = (table.leases, table.slot, table.scoped());
    let read = format!(
        "SELECT CAST({slot} AS BIGINT), owner, incarnation, token, expires_at_ms FROM {leases} \
         WHERE {scoped} ORDER BY {slot}"
    );
    let read = match tx.backend() {
        crate::db::Backend::Sqlite => read,
        crate::db::Backend::Postgres => format!("{read} FOR UPDATE"),
    };
    let rows: Vec<(i64, Option<String>, i64, i64, i64)> = tx.fetch_all(table.query(read)).await?;
    let slots = rows
        .into_iter()
        .map(|(slot, owner, incarnation, token, expires_at_ms)| {
            Ok(SlotLease {
                slot: table.slot_of(slot)?,
                owner,
                incarnation,
                token,
                expires_at_ms,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;

    // Under the slot locks, so the members' bookkeeping is serialised too.
    let members = table.members;
    tx.execute(table.heartbeat(owner, now_ms)).await?;
    tx.execute(
        table
            .query(format!(
                "DELETE FROM {members} WHERE {scoped} AND seen_at_ms <= {}",
                table.param(1)
            ))
            .bind(now_ms.saturating_sub(ttl_ms)),
    )
    .await?;
    let live: Option<i64> = tx
        .scalar(table.query(format!("SELECT COUNT(*) FROM {members} WHERE {scoped}")))
        .await?;
    let live = live
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1)
        .max(1);
    let plan = plan_balance(holder, &slots, live, now_ms);
    if plan.superseded {
        tracing::error!(
            member = owner,
            table = leases,
            "a later process runs under this member's name and holds its slots; this one \
             holds none (give each process a name of its own)"
        );
    }

    // The slots, the owner and its incarnation, then the new expiry where a write sets one.
    // Taking bumps the token, so the previous holder's writes are refused from now on.
    let expires = now_ms.saturating_add(ttl_ms);
    let (in_slots, who, life, until) = (
        table.param(1),
        table.param(2),
        table.param(3),
        table.param(4),
    );
    let writes: [(String, &[u32], bool); 3] = [
        (
            format!(
                "owner = NULL, expires_at_ms = 0 \
                 WHERE owner = {who} AND incarnation = {life} AND"
            ),
            &plan.release,
            false,
        ),
        (
            format!("expires_at_ms = {until} WHERE owner = {who} AND incarnation = {life} AND"),
            &plan.renew,
            true,
        ),
        (
            format!(
                "owner = {who}, incarnation = {life}, token = token + 1, \
                 expires_at_ms = {until} WHERE"
            ),
            &plan.take,
            true,
        ),
    ];
    for (change, slots, sets_expiry) in writes {
        if slots.is_empty() {
            continue;
        }
        let listed = match tx.backend() {
            crate::db::Backend::Sqlite => {
                format!("{slot} IN (SELECT value FROM json_each({in_slots}))")
            }
            crate::db::Backend::Postgres => format!("{slot} = ANY({in_slots})"),
        };
        let statement = table
            .query(format!(
                "UPDATE {leases} SET {change} {scoped} AND {listed}"
            ))
            .bind(IntList(slots.iter().map(|&s| i64::from(s)).collect()))
            .bind(owner)
            .bind(holder.incarnation);
        let statement = if sets_expiry {
            statement.bind(expires)
        } else {
            statement
        };
        tx.execute(statement).await?;
    }
    let held: Vec<(i64, i64, i64)> = tx
        .fetch_all(
            table
                .query(format!(
                    "SELECT CAST({slot} AS BIGINT), token, expires_at_ms FROM {leases} \
                     WHERE {scoped} AND owner = {} AND incarnation = {} ORDER BY {slot}",
                    table.param(1),
                    table.param(2)
                ))
                .bind(owner)
                .bind(holder.incarnation),
        )
        .await?;
    held.into_iter()
        .map(|(slot, token, expires_at_ms)| {
            Ok(HeldSlot {
                slot: table.slot_of(slot)?,
                token,
                expires_at_ms,
            })
        })
        .collect()
}

/// Gives back every slot this life of `holder` holds and removes its name from the members,
/// so the others take over at once. Tokens stay: the next holder increments them, fencing any
/// late write. A later life's slots stay with it (it heartbeats its name back in).
pub(crate) async fn release(
    tx: &mut Tx,
    table: &LeaseTable<'_>,
    holder: &Holder,
) -> Result<(), StoreError> {
    let owner = holder.name.as_str();
    let (scoped, who, life) = (table.scoped(), table.param(1), table.param(2));
    let leases = table.leases;
    tx.execute(
        table
            .query(format!(
                "UPDATE {leases} SET owner = NULL, expires_at_ms = 0 \
                 WHERE {scoped} AND owner = {who} AND incarnation = {life}"
            ))
            .bind(owner)
            .bind(holder.incarnation),
    )
    .await?;
    let (members, member) = (table.members, table.member);
    tx.execute(
        table
            .query(format!(
                "DELETE FROM {members} WHERE {scoped} AND {member} = {who}"
            ))
            .bind(owner),
    )
    .await?;
    Ok(())
}
