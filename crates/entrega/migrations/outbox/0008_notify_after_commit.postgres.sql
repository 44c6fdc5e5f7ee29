-- A NOTIFY in a transaction takes one lock for the whole server at commit and keeps it until
-- the commit is on disk, so every transaction that writes to the outbox would wait for every
-- other one's disk write. entrega's own sessions (`entrega.notify = after_commit`, set when
-- they connect) notify in a statement of their own once the transaction has committed; any
-- other writer, such as a service inserting rows by hand, is still notified here.
CREATE OR REPLACE FUNCTION entrega_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('entrega.notify', true), '') <> 'after_commit' THEN
        PERFORM pg_notify('entrega_outbox', '');
    END IF;
    RETURN NULL;
END
$$;
