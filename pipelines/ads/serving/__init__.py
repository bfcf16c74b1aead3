"""The student in service: the registry and its champion rule (registry), the MLflow model a version is
(student_model, and student_pyfunc, the served code), batch scoring (score, ``agpo score``) and the HTTP server
(serve, ``agpo serve``)."""
