-- PostgreSQL only, after 0003_english_names.sql: its constraint names.
ALTER TABLE entrega_parked RENAME CONSTRAINT entrega_aparcados_pkey TO entrega_parked_pkey;
