; Definitions and references for C#.
(class_declaration name: (identifier) @name) @definition.class
(record_declaration name: (identifier) @name) @definition.class
(struct_declaration name: (identifier) @name) @definition.struct
(interface_declaration name: (identifier) @name) @definition.interface
(enum_declaration name: (identifier) @name) @definition.enum
(method_declaration name: (identifier) @name) @definition.method
(constructor_declaration name: (identifier) @name) @definition.method
(property_declaration name: (identifier) @name) @definition.property
(namespace_declaration name: (_) @name) @definition.module
(invocation_expression function: (identifier) @reference.call)
(invocation_expression function: (member_access_expression name: (identifier) @reference.call))
(object_creation_expression type: (identifier) @reference.type)
(using_directive (identifier) @reference.import)
(using_directive (qualified_name) @reference.import)
(base_list (identifier) @reference.type)
