-- Pending rows the transport refused (waiting for their next attempt, or parked). Small, and
-- empty while nothing is refused: the relay's pending read asks it once per lane and, only
-- when the lane has refused rows, once per row, so the read costs what it did before while
-- nothing is blocked.
CREATE INDEX IF NOT EXISTS outbox_blocked ON outbox (lane, agregado_id)
    WHERE publicado_en IS NULL AND (proximo_intento IS NOT NULL OR aparcado_en IS NOT NULL);
