"""``causalab server``: a team's tracking stack (PostgreSQL + ``mlflow server``) and its login."""
