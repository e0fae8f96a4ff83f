/**
 * forkd v0.5's stateful workspaces (`/v1/workspaces`), wire-compatible: create (201), list, get, delete (204),
 * suspend `{diff}` and resume (200 with the WorkspaceInfo). Suspend is a pause and resume a resume of the
 * workspace's sandbox (controller/sandboxes/workspaces.ts), so unlike v0.5 the sandbox keeps its id and network.
 * Every handler goes through the request's view: a tenant has no workspaces (controller/tenancy/tenant-view.ts).
 */
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import {
  CreateWorkspaceBody,
  errorResponses,
  OptionalBody,
  SuspendWorkspaceBody,
  WorkspaceInfoWire,
  WorkspaceNameParams,
} from "../schemas.js";

type NameRoute = { Params: Static<typeof WorkspaceNameParams> };
type CreateRoute = { Body: Static<typeof CreateWorkspaceBody> };
type SuspendRoute = NameRoute & { Body: Static<typeof SuspendWorkspaceBody> | undefined };
type ResumeRoute = NameRoute & { Body: Record<string, never> | undefined };

export function registerWorkspaceRoutes(app: FastifyInstance): void {
  app.get("/v1/workspaces", { schema: listSchema }, async (request) => workspacesOf(request).list());
  app.post<CreateRoute>("/v1/workspaces", { schema: createSchema }, createWorkspace);
  app.get<NameRoute>("/v1/workspaces/:name", { schema: getSchema }, async (request) =>
    workspacesOf(request).get(request.params.name),
  );
  app.delete<NameRoute>("/v1/workspaces/:name", { schema: deleteSchema }, deleteWorkspace);
  app.post<SuspendRoute>("/v1/workspaces/:name/suspend", { schema: suspendSchema }, suspendWorkspace);
  app.post<ResumeRoute>("/v1/workspaces/:name/resume", { schema: resumeSchema }, resumeWorkspace);
}

const workspacesOf = (request: FastifyRequest) => servicesOf(request).sandboxes.workspaces;

const listSchema = {
  tags: ["workspaces"],
  summary: "List workspaces (forkd v0.5)",
  response: { 200: Type.Array(WorkspaceInfoWire), ...errorResponses },
};

const createSchema = {
  tags: ["workspaces"],
  summary: "Create a workspace: a sandbox from snapshot_tag, suspended and resumed by name",
  description: "409 if the name is taken; 400 for a name that is not 1-64 of [A-Za-z0-9_-].",
  body: CreateWorkspaceBody,
  response: { 201: WorkspaceInfoWire, ...errorResponses },
};

async function createWorkspace(request: FastifyRequest<CreateRoute>, reply: FastifyReply) {
  const body = request.body;
  const created = await workspacesOf(request).create({
    name: body.name,
    snapshotTag: body.snapshot_tag,
    memoryLimitMiB: body.memory_limit_mib ?? undefined,
    ownNamespace: body.per_child_netns,
    signal: clientSignal(request, reply),
  });
  if (created.live_sandbox_id) request.auditIds.push(created.live_sandbox_id);
  return reply.status(201).send(created);
}

const getSchema = {
  tags: ["workspaces"],
  summary: "One workspace",
  params: WorkspaceNameParams,
  response: { 200: WorkspaceInfoWire, ...errorResponses },
};

const deleteSchema = {
  tags: ["workspaces"],
  summary: "Delete a workspace: its sandbox is killed; its layers go unless a snapshot depends on them",
  params: WorkspaceNameParams,
  response: { 204: Type.Null(), ...errorResponses },
};

async function deleteWorkspace(request: FastifyRequest<NameRoute>, reply: FastifyReply) {
  await workspacesOf(request).delete(request.params.name);
  return reply.status(204).send();
}

const suspendSchema = {
  tags: ["workspaces"],
  summary: "Suspend: pause the workspace's sandbox",
  description: "400 unless it is running (v0.5's answer).",
  params: WorkspaceNameParams,
  body: OptionalBody(SuspendWorkspaceBody),
  response: { 200: WorkspaceInfoWire, ...errorResponses },
};

async function suspendWorkspace(request: FastifyRequest<SuspendRoute>, reply: FastifyReply) {
  return workspacesOf(request).suspend(request.params.name, {
    diff: request.body?.diff,
    signal: clientSignal(request, reply),
  });
}

const resumeSchema = {
  tags: ["workspaces"],
  summary: "Resume the workspace's sandbox where it was suspended",
  description:
    "400 if it is running. A stale workspace (its sandbox gone) starts again from its latest suspend.",
  params: WorkspaceNameParams,
  body: OptionalBody(Type.Object({}, { additionalProperties: false })),
  response: { 200: WorkspaceInfoWire, ...errorResponses },
};

async function resumeWorkspace(request: FastifyRequest<ResumeRoute>, reply: FastifyReply) {
  return workspacesOf(request).resume(request.params.name, { signal: clientSignal(request, reply) });
}
