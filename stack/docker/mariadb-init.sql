-- docker-compose.yml: runs once when the mariadb volume is new (/docker-entrypoint-initdb.d).
-- The image creates database and user stocksvr from MARIADB_* but grants only that database;
-- the tests create a fresh database each, as with scripts/stack.
GRANT ALL PRIVILEGES ON *.* TO 'stocksvr'@'%' WITH GRANT OPTION;
FLUSH PRIVILEGES;
