# Upstream for the differential test: a minimal Rails 6.1 application (Debian's ruby-rails), API
# mode, served by WEBrick (Debian 12 has no puma), knowing nothing about fencing.
#
#     ruby tests/upstreams/rails_app/server.rb PORT
#
# It serves on 127.0.0.1:PORT until killed and prints nothing. Control endpoints (hit directly,
# not through the gateway): GET /_record (the JSON array of records), POST /_reset.
#
# Every method except GET, HEAD, OPTIONS and TRACE, compared as Rails reports it
# (request.request_method), is a write: it appends a record {method, path, resource, fence, body
# [, source_resource]} and answers 200 {"applied": RESOURCE}; a read answers 200 {"read": RESOURCE}.
# Nothing is normalised here beyond what Rails, Rack and WEBrick do themselves.
#
# How Rails reads the request (defaults kept; see README.md for observed examples):
# - Methods: every route is `match ..., via: :all`, so the router accepts any verb, but
#   ActionDispatch::Request#request_method only knows the RFC 2616/2518/3253/3648/3744/5323/4791/
#   5789 list (GET ... CONNECT, PROPFIND PROPPATCH MKCOL COPY MOVE LOCK UNLOCK, REPORT MERGE ...,
#   SEARCH, PATCH), compared case-sensitively: FOO, or any lower-case method such as `get`, raises
#   ActionController::UnknownHttpMethod, which Rails answers itself with 405 (nothing recorded).
#   WEBrick passes any method through as sent, but answers a POST or PUT that has neither
#   Content-Length nor chunked encoding with its own 411.
# - Path: before routing, Rails squeezes repeated slashes (`//` -> `/`), strips one trailing slash
#   and upper-cases percent-escapes (Journey::Router::Utils.normalize_path); WEBrick has already
#   collapsed leading slashes, and refuses with its own 400 a path that climbs above `/` with `..`
#   or that URI.parse rejects (raw `{`, `}`, a bad escape like %ZZ). Matching is
#   case-sensitive (/INVOICES/1 is other:). Every route but the catch-all gets Rails' optional
#   `(.:format)` suffix and
#   a dynamic segment matches [^/.?]+, so /invoices/1.json is invoice:1 (format json) and
#   /orders/4.2e1 is the order "4" with format "2e1". Path parameters are percent-decoded; `;` is an
#   ordinary character. `path` in a record is request.path, i.e. the normalised (still
#   percent-encoded) path Rails routed.
# - Query and parameters: params[:id] through Rack's nested query parser: the last `id` wins,
#   `;` separates like `&`, `id[]=7` is an array, `[id]=42` and `id]=42` also set `id`, and
#   `id=7&id[]=42` is Rails' own 400. Body parameters (form or JSON) are merged under the query and
#   path parameters, so a form body's `id` is used only when the query has none. An array or hash
#   is recorded as JSON, as Express does.
# - Headers: request.headers["X-Tenant"] reads the Rack variable HTTP_X_TENANT, which both
#   `X-Tenant` and `X_Tenant` map to (the later one in the request wins); WEBrick joins repeated
#   headers with ", ".
# - MOVE/COPY: the Destination header (path or absolute URL) is resolved with
#   Rails.application.routes.recognize_path, Rails' own router (which normalises a path but not
#   the path of an absolute URL); its query through Rails' own query parser. A Destination naming
#   a typed resource is read as that resource (below): one ActiveRecord rejects makes the MOVE a
#   404. Repeated Destination headers arrive joined by ", " and so resolve to other:.
#
# Typed ids (table B) are read by ActiveRecord, as `Model.find_or_create_by!(id: params[:id])`
# (or the header) in an ordinary Rails app:
# - order/parcel/ledger/shipment: integer primary keys in SQLite (in memory, tables created at
#   boot), cast by ActiveModel::Type::Integer: String#to_i after `presence` (so " 42", "+42",
#   "42abc", "4_2" are 42, "4.2e1" is 4, "0x2A" is 0) and range-checked to 64 bits (Rails'
#   SQLite3Integer).
# - ticket/badge/tally/crate: uuid primary keys in PostgreSQL (127.0.0.1:5432, database `test`,
#   a schema of this process's own, dropped at exit), cast by the PostgreSQL adapter's uuid type
#   (OID::Uuid: 32 hex digits, a hyphen allowed after any group of four, optionally in braces),
#   then parsed by PostgreSQL itself.
# The resource is the id of the row the write went to, as the database stores it ("#{record.id}"
# after reloading the row: a freshly created record would otherwise echo the spelling it was
# created with, e.g. upper case or braces). When ActiveRecord's own query reading of the id is
# nil (a non-numeric string such as "abc" or "４２", blank, out of range, an array, or anything the
# uuid type rejects), where(id:) can match no row and find would raise RecordNotFound, so the app
# raises RecordNotFound: Rails' own 404, nothing recorded. (Left alone, find_or_create_by! would
# INSERT a row with the value the attribute cast gives: 0 for "abc", then RecordNotUnique (a 500)
# the second time; a new database-generated uuid each time for a bad UUID.) A value OID::Uuid
# accepts but PostgreSQL refuses (a trailing hyphen) is a 500 (ActiveRecord::StatementInvalid).
#
# Files: a temporary directory (the Rails root: config/database.yml) removed at exit. PostgreSQL:
# schema rails_<port>_<pid>, one connection pool of 2; it is dropped at a TERM/INT exit, or, if the
# process is killed outright (SIGKILL, as the Rust harness's Child::kill does), by a small
# watchdog process that waits on a pipe for this one to die. Schemas of the same pattern whose
# process is gone are dropped at boot. Reads of typed resources find or create the row too.

port = Integer(ARGV.fetch(0) { abort "usage: ruby server.rb PORT" })

ENV["RAILS_ENV"] = "production"
ENV.delete("DATABASE_URL") # would be merged into the database configuration

require "tmpdir"
require "fileutils"
require "json"
require "yaml"

PG_SETTINGS = { host: "127.0.0.1", port: 5432, user: "postgres", dbname: "test" }.freeze
SCHEMA = "rails_#{port}_#{Process.pid}"
ROOT = Dir.mktmpdir("rails_upstream_")

def drop_schema_with_pg(schema)
  require "pg"
  conn = PG.connect(**PG_SETTINGS, connect_timeout: 10)
  conn.exec("SET client_min_messages TO warning")
  conn.exec("DROP SCHEMA IF EXISTS #{PG::Connection.quote_ident(schema)} CASCADE")
ensure
  conn&.close
end

# The watchdog: forked before Rails loads (small), it blocks reading a pipe whose only writer is
# this process; when this process is gone, however it died, the read returns and it cleans up.
watch_reader, watch_writer = IO.pipe
watchdog = fork do
  watch_writer.close
  $stdin.reopen(File::NULL)
  $stdout.reopen(File::NULL, "w")
  $stderr.reopen(File::NULL, "w")
  Signal.trap("INT", "IGNORE")
  Signal.trap("TERM", "IGNORE")
  watch_reader.read
  begin
    drop_schema_with_pg(SCHEMA)
  rescue StandardError
    nil
  end
  FileUtils.rm_rf(ROOT)
  exit!(0)
end
watch_reader.close
Process.detach(watchdog)

FileUtils.mkdir_p(File.join(ROOT, "config"))
File.write(File.join(ROOT, "config", "database.yml"), YAML.dump(
  "production" => {
    "primary" => {
      "adapter" => "sqlite3",
      "database" => ":memory:",
      # One connection: every SQLite in-memory connection is a database of its own. Never
      # reaped (idle_timeout 0), or the tables would go with it.
      "pool" => 1,
      "idle_timeout" => 0,
      "checkout_timeout" => 30,
    },
    "uuids" => {
      "adapter" => "postgresql",
      "host" => PG_SETTINGS[:host],
      "port" => PG_SETTINGS[:port],
      "username" => PG_SETTINGS[:user],
      "database" => PG_SETTINGS[:dbname],
      "pool" => 2,
      "checkout_timeout" => 30,
      "schema_search_path" => SCHEMA,
      "min_messages" => "warning",
    },
  },
))

require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "rack/handler/webrick"

class RailsUpstream < Rails::Application
  config.load_defaults 6.1
  config.root = ROOT
  config.api_only = true
  config.eager_load = true
  config.secret_key_base = "differential-test-" * 4
  config.logger = ActiveSupport::Logger.new(File::NULL)
  config.log_level = :fatal
  config.hosts.clear
  config.consider_all_requests_local = false
  config.public_file_server.enabled = false
  config.cache_store = :null_store
  config.active_record.dump_schema_after_migration = false
end

# Initialised before the models are defined: connects_to needs the database configuration.
Rails.application.initialize!

class ApplicationRecord < ActiveRecord::Base
  self.abstract_class = true
end

# Models on the PostgreSQL connection (uuid primary keys).
class UuidRecord < ApplicationRecord
  self.abstract_class = true
  connects_to database: { writing: :uuids }
end

class Order < ApplicationRecord; end
class Parcel < ApplicationRecord; end
class Ledger < ApplicationRecord; end
class Shipment < ApplicationRecord; end
class Ticket < UuidRecord; end
class Badge < UuidRecord; end
class Tally < UuidRecord
  self.table_name = "tallies"
end
class Crate < UuidRecord; end

RECORDS = []
RECORDS_LOCK = Mutex.new
READ_METHODS = %w[GET HEAD OPTIONS TRACE].freeze

class RecordsController < ActionController::API
  # The typed actions: their model, and where the id is read from (path parameter, query
  # parameter `id`, or a header), for the request as for a Destination.
  TYPED = {
    "order" => [Order, :path], "parcel" => [Parcel, :path],
    "ticket" => [Ticket, :path], "badge" => [Badge, :path],
    "ledger" => [Ledger, :query], "tally" => [Tally, :query],
    "shipment" => [Shipment, "X-Shipment"], "crate" => [Crate, "X-Crate"],
  }.freeze

  def index
    render json: RECORDS_LOCK.synchronize { RECORDS.dup }
  end

  def reset
    RECORDS_LOCK.synchronize { RECORDS.clear }
    render json: { reset: true }
  end

  def invoice = handle("invoice:#{params[:id]}")
  def accounts = handle("acct:#{scalar(params[:id])}")
  def doc = handle("doc:#{tenant}:#{params[:id]}")
  def other = handle("other:#{request.path}")

  def order = handle(typed_resource("order", params[:id]))
  def parcel = handle(typed_resource("parcel", params[:id]))
  def ticket = handle(typed_resource("ticket", params[:id]))
  def badge = handle(typed_resource("badge", params[:id]))
  def ledger = handle(typed_resource("ledger", params[:id]))
  def tally = handle(typed_resource("tally", params[:id]))
  def shipment = handle(typed_resource("shipment", request.headers["X-Shipment"]))
  def crate = handle(typed_resource("crate", request.headers["X-Crate"]))

  private

  def tenant
    request.headers["X-Tenant"].to_s
  end

  def scalar(value)
    case value
    when nil then ""
    when String then value
    when ActionController::Parameters then value.to_unsafe_h.to_json
    else value.to_json
    end
  end

  # The row ActiveRecord reads `raw` as, found or created: "<name>:<id as stored>".
  def typed_resource(name, raw)
    model = TYPED.fetch(name).first
    type = model.type_for_attribute(model.primary_key)
    key = begin
      type.serialize(raw) # what `WHERE id = ?` binds
    rescue ActiveModel::RangeError
      nil # where() matches nothing out of range
    end
    if key.nil?
      raise ActiveRecord::RecordNotFound.new(
        "Couldn't find #{model.name} with 'id'=#{raw.inspect}", model.name, "id", raw
      )
    end
    record = model.find_or_create_by!(id: raw)
    "#{name}:#{record.reload.id}"
  end

  def handle(resource)
    method = request.request_method
    return render(json: { read: resource }) if READ_METHODS.include?(method)

    record = {
      method: method,
      path: request.path,
      resource: resource,
      fence: request.headers["X-Fence"],
      body: request.raw_post.to_s.dup.force_encoding(Encoding::UTF_8).scrub,
    }
    dest = request.headers["Destination"]
    if %w[MOVE COPY].include?(method.upcase) && !dest.nil?
      record[:source_resource] = resource
      record[:resource] = resource = destination_resource(dest, method)
    end
    RECORDS_LOCK.synchronize { RECORDS << record }
    render json: { applied: resource }
  end

  # What the Destination maps to, through Rails' own router.
  def destination_resource(dest, method)
    recognized = Rails.application.routes.recognize_path(dest, method: method)
    query = ActionDispatch::Request.new(Rack::MockRequest.env_for(dest)).query_parameters
    case (action = recognized[:action])
    when "invoice" then "invoice:#{recognized[:id]}"
    when "accounts" then "acct:#{scalar(query["id"])}"
    when "doc" then "doc:#{tenant}:#{recognized[:id]}"
    when *TYPED.keys
      source = TYPED[action].last
      raw = case source
            when :path then recognized[:id]
            when :query then query["id"]
            else request.headers[source]
            end
      typed_resource(action, raw)
    else "other:#{destination_path(dest)}"
    end
  rescue ActionController::RoutingError, URI::InvalidURIError, ArgumentError
    "other:#{dest}"
  end

  # The path recognize_path matched: normalised when the Destination is a path, as it is (from
  # URI.parse) when it is an absolute URL.
  def destination_path(dest)
    return URI.parse(dest).path if dest.include?("://")

    ActionDispatch::Journey::Router::Utils.normalize_path(dest.split("?", 2).first)
  end
end

Rails.application.routes.draw do
  # Control endpoints first.
  get "/_record", to: "records#index"
  post "/_reset", to: "records#reset"

  match "/invoices/:id", to: "records#invoice", via: :all
  match "/accounts", to: "records#accounts", via: :all
  match "/docs/:id", to: "records#doc", via: :all

  match "/orders/:id", to: "records#order", via: :all
  match "/parcels/:id", to: "records#parcel", via: :all
  match "/tickets/:id", to: "records#ticket", via: :all
  match "/badges/:id", to: "records#badge", via: :all
  match "/ledgers", to: "records#ledger", via: :all
  match "/tallies", to: "records#tally", via: :all
  match "/shipments", to: "records#shipment", via: :all
  match "/crates", to: "records#crate", via: :all

  match "/", to: "records#other", via: :all
  match "*path", to: "records#other", via: :all, format: false
end

def drop_stale_schemas(connection)
  connection.select_values(
    "SELECT nspname FROM pg_namespace WHERE nspname ~ '^rails_[0-9]+_[0-9]+$'"
  ).each do |schema|
    pid = schema[/\d+\z/].to_i
    begin
      Process.kill(0, pid)
      next # its process is alive
    rescue Errno::EPERM
      next
    rescue Errno::ESRCH
      connection.execute("DROP SCHEMA IF EXISTS #{connection.quote_table_name(schema)} CASCADE")
    end
  end
end

# The tables, created at boot: integer keys in SQLite, uuid keys in this process's own schema.
ActiveRecord::Migration.verbose = false
sqlite = Order.connection
%i[orders parcels ledgers shipments].each { |table| sqlite.create_table(table) }
pg = UuidRecord.connection
drop_stale_schemas(pg)
pg.execute("CREATE SCHEMA #{pg.quote_table_name(SCHEMA)}")
%i[tickets badges tallies crates].each { |table| pg.create_table(table, id: :uuid) }
ActiveRecord::Base.clear_active_connections!

cleaned = false
cleanup = lambda do
  next if cleaned

  cleaned = true
  begin
    UuidRecord.connection.execute("DROP SCHEMA IF EXISTS #{UuidRecord.connection.quote_table_name(SCHEMA)} CASCADE")
    ActiveRecord::Base.connection_handler.clear_all_connections!
  rescue StandardError
    nil
  end
  FileUtils.rm_rf(ROOT)
end
at_exit { cleanup.call }

Rack::Handler::WEBrick.run(
  Rails.application,
  Host: "127.0.0.1",
  Port: port,
  AccessLog: [],
  Logger: WEBrick::Log.new(File::NULL),
) do |server|
  %w[INT TERM].each { |signal| Signal.trap(signal) { server.shutdown } }
end
