# The jobdist site daemon (and the one-shot `python -m jobdist.setup`), for docker-compose.yml.
#   docker build -t jobdist .
#   docker run --rm -v $PWD/my-site.toml:/etc/jobdist/site.toml:ro jobdist
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/jobdist
COPY pyproject.toml README.md ./
COPY jobdist ./jobdist
COPY couch_design ./couch_design
# A plain install: the design documents go into the package (jobdist.couch_design).
RUN pip install .

# The compose sites; mount your own directory here (or a single /etc/jobdist/site.toml).
COPY sites/compose /etc/jobdist/sites

# Steps are shell commands: never run them as root.
RUN useradd --system --uid 10001 --create-home --home-dir /home/jobdist jobdist
USER jobdist
WORKDIR /home/jobdist

# The admin endpoint ([admin] port in the site config).
EXPOSE 7984
ENTRYPOINT ["jobdist", "site", "run"]
CMD ["--config", "/etc/jobdist/site.toml"]
