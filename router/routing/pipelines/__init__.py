"""Model pipelines: their table, the router model's choice and the cascade's draft as steps."""
