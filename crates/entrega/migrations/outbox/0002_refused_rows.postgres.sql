-- Rows the transport refused (too large, unknown topic): attempts, when to try again, why it
-- last failed, and when the row was parked for an operator. Every column has a default, so
-- the seed's own INSERT keeps working.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS intentos INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS proximo_intento TIMESTAMPTZ;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS ultimo_error TEXT;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS aparcado_en TIMESTAMPTZ;

-- Pending refused rows only: empty while nothing is refused, so the relay's pending read,
-- which asks it once per lane, costs what it did before.
CREATE INDEX IF NOT EXISTS outbox_blocked ON outbox (lane, agregado_id, seq)
    WHERE publicado_en IS NULL AND (proximo_intento IS NOT NULL OR aparcado_en IS NOT NULL);
