-- Tenants. A session belongs to the tenant on the subject of its first event — an identity
-- the NATS server vouches for, never a payload field — and every request names its tenant the same
-- way. Sessions recorded before tenancy are the default tenant's.
ALTER TABLE ctx.sessions ADD COLUMN tenant text NOT NULL DEFAULT 'default';

-- Policies are registered per tenant. The built-in revision of 'default' moves to tenant '' (shared:
-- every tenant may name it); a tenant's own registrations number on from the shared ones, so a
-- session's (name, revision) is unambiguous within its tenant.
ALTER TABLE ctx.policies ADD COLUMN tenant text NOT NULL DEFAULT 'default';
UPDATE ctx.policies SET tenant = '' WHERE name = 'default' AND revision = 1;
ALTER TABLE ctx.policies DROP CONSTRAINT policies_pkey, ADD PRIMARY KEY (tenant, name, revision);

-- Tool catalogs are registered per tenant: two tenants may ship releases of the same name.
ALTER TABLE ctx.tool_catalogs ADD COLUMN tenant text NOT NULL DEFAULT 'default';
ALTER TABLE ctx.tool_catalogs DROP CONSTRAINT tool_catalogs_pkey, ADD PRIMARY KEY (tenant, release, revision);

-- A prepare waiting for an event learns of its rejection only when it was its own tenant's event.
ALTER TABLE ctx.dead_letters ADD COLUMN tenant text NOT NULL DEFAULT 'default';
