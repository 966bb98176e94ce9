"""The project as a whole: the import layering, the docs site and README examples, installation, the container run."""
